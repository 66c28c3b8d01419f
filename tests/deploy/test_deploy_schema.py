"""The schema dataclasses are the one source: base.yaml is generated from them, profiles are frozen attributes."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from k26_ddtree.deploy import basegen
from k26_ddtree.deploy.profiles import load_profile, profiles_dir, to_json
from k26_ddtree.deploy.schema import Profile, Speculative, default, keys
from k26_ddtree.deploy.units import PROFILE_MARK, profile_from_unit, render_service
from k26_ddtree.deploy.values import dotted_keys, to_data


def test_base_yaml_is_generated_from_the_schema():
    committed = (profiles_dir() / "base.yaml").read_text(encoding="utf-8")
    assert committed == basegen.base_yaml(), "base.yaml is stale: run python -m k26_ddtree.deploy.basegen"


def test_base_yaml_values_are_the_schema_defaults():
    defaults = to_data(Profile(name="base", sources=()))
    assert yaml.safe_load((profiles_dir() / "base.yaml").read_text(encoding="utf-8")) == defaults


def test_every_key_is_documented_in_base_yaml_on_one_line():
    text = (profiles_dir() / "base.yaml").read_text(encoding="utf-8")
    for dotted in dotted_keys(Profile):
        name = dotted.rsplit(".", 1)[-1]
        assert f"# {name} (" in text, f"{dotted} has no doc line in base.yaml"
    assert all(len(line) < 200 for line in text.splitlines())


def test_keys_are_fields_with_docs_and_name_and_sources_are_not_keys():
    assert "name" not in keys(Profile) and "sources" not in keys(Profile)
    assert keys(Profile)["speculative"].section is not None
    assert keys(Profile)["python"].describe() == "path or null"
    assert "speculative.budget" in dotted_keys(Profile) and "router.worker_urls" in dotted_keys(Profile)


def test_profiles_are_frozen_attributes():
    profile = load_profile("pcie-ep8")
    assert profile.speculative.budget == 8 and profile.parallel.ep_size == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.speculative.budget = 16
    with pytest.raises(TypeError):
        profile.environment["A"] = "1"
    assert isinstance(profile.extra_args, tuple) and isinstance(profile.router.worker_urls, tuple)


def test_the_embedded_json_keeps_its_layout():
    profile = load_profile("pcie-ep4-tp2", ["environment.A=1", "extra_args=--enable-cache-report"])
    raw = json.loads(to_json(profile))
    assert sorted(raw) == ["data", "name", "sources"]
    assert raw["data"]["speculative"]["budget"] == 8 and raw["data"]["environment"] == {"A": "1"}
    assert raw["data"]["extra_args"] == ["--enable-cache-report"]


def test_a_unit_rendered_before_a_key_existed_still_reads():
    """Units installed by an older k26-deploy lack the keys added since; those take their defaults."""
    text = render_service(load_profile("pcie-ep8"))
    line = next(line for line in text.splitlines() if line.startswith(PROFILE_MARK))
    raw = json.loads(line[len(PROFILE_MARK):])
    del raw["data"]["open_without_api_key"]
    older = text.replace(line, PROFILE_MARK + json.dumps(raw))
    assert profile_from_unit(older, "old.service") == profile_from_unit(text, "new.service")



def test_the_server_side_constants_the_deploy_side_repeats_agree():
    """The deploy side does not import k26_ddtree.sglang.common.args (it imports torch): its copies must match."""
    from k26_ddtree.deploy.profiles import DDTREE_ATTENTION_BACKEND
    from k26_ddtree.sglang.common import args

    assert default(Speculative, "trace_max_mb") == args.DEFAULT_TRACE_MAX_MB
    assert DDTREE_ATTENTION_BACKEND == args.SUPPORTED_ATTENTION_BACKEND
