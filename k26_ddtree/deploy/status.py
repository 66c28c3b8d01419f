"""`k26-deploy status`: the installed config, MainPID, uptime, readiness, last acceptance length."""

from __future__ import annotations

import json
from pathlib import Path

from k26_ddtree.deploy import readiness, systemd
from k26_ddtree.deploy.envfile import api_key_for
from k26_ddtree.deploy.service import installed_unit, last_good_path
from k26_ddtree.deploy.units import local_url, profile_from_unit


def collect(unit: str, states: Path) -> dict:
    unit_path = installed_unit(unit)
    profile = profile_from_unit(unit_path.read_text(encoding="utf-8"), str(unit_path))
    props = systemd.show(unit, "ActiveState", "SubState", "MainPID", "NRestarts", "Result")
    pid = int(props["MainPID"]) if props["MainPID"].isdigit() else 0
    url = local_url(profile)
    report = {
        "unit": systemd.unit_file_name(unit),
        "unit_file": str(unit_path),
        "profile": profile.name,
        "config": profile.summary(),
        "url": url,
        "active": f"{props['ActiveState']} ({props['SubState']})",
        "main_pid": pid,
        "restarts": int(props["NRestarts"] or 0),
        "uptime_sec": None,
        "ready": False,
        "readiness": "not running",
        "acceptance_length": None,
        "live_budget_topk": None,
        "last_good": None,
    }
    if pid:
        uptime = readiness.process_uptime(pid)
        report["uptime_sec"] = round(uptime) if uptime is not None else None
        look = readiness.probe(pid, url)
        report["ready"], report["readiness"] = look.ready, f"{look.state}: {look.detail}"
        info = readiness.server_info(url, api_key_for(profile)) if look.ready else None
        if info:
            states_list = info.get("internal_states") or [{}]
            report["acceptance_length"] = states_list[0].get("avg_spec_accept_length")
            report["live_budget_topk"] = [info.get("speculative_ddtree_budget"), info.get("speculative_ddtree_topk")]
    good = last_good_path(states, unit)
    if good.is_file():
        report["last_good"] = f"{good}: {profile_from_unit(good.read_text(encoding='utf-8'), str(good)).summary()}"
    return report


def show(report: dict, as_json: bool) -> str:
    if as_json:
        return json.dumps(report, indent=2)
    accept = report["acceptance_length"]
    live = report["live_budget_topk"]
    rows = [
        ("unit", f"{report['unit']} ({report['unit_file']})"),
        ("config", report["config"]),
        ("active", report["active"] + (f", {report['restarts']} restarts" if report["restarts"] else "")),
        ("main pid", str(report["main_pid"] or "-")),
        ("uptime", _duration(report["uptime_sec"])),
        ("url", report["url"]),
        ("readiness", report["readiness"]),
        ("acceptance", f"{accept:.2f} tokens/step (avg since start or last flush)" if accept else "none yet"),
    ]
    if live and live[0] is not None:
        rows.append(("live", f"budget {live[0]}, topk {live[1]} (from /server_info)"))
    rows.append(("last-good", report["last_good"] or "none recorded yet"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
