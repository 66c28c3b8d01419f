"""Make the proving-ground model pair on a GPU: text, tokenizer, trained target, trained drafters.

    python -m proving_ground.train --out DIR [--seed 0] [--time-budget 150] [--text-root DIR]

    python -m proving_ground.train --out DIR --add-drafter mid [--device cpu]

    python -m proving_ground.train --out DIR --redraft [--time-budget 150]

    python -m proving_ground.train --out DIR --check-determinism

Writes DIR/target (DeepseekV3ForCausalLM + tokenizer), DIR/drafter, DIR/drafter-weak,
DIR/drafter-weaker and DIR/drafter-mid (DFlashDraftModel), DIR/prompts.json (128 prompts as
token ids: the first 64 served in tables, the rest traced for tune), DIR/train_report.json and
DIR/acceptance.json. --add-drafter trains one goal drafter against the target already in DIR
(on the CPU too) and adds it to both reports, so a carried model archive gains a drafter
without a new target.
The text is Python source (proving_ground.corpus). The target trains until its greedy
continuations of the eval prompts are the text (MEMORIZED of the tokens) with a median
top-1/top-2 log-prob gap over GAP_GOAL nats, or its share of the budget ends; the report gives
every continuation's shortest period and the share of it that is the text. The drafter ("real")
then trains DFlash-style on the frozen target's own continuations of the text (distill_set) until
its simulated acceptance stops improving. The goal drafters are that
training's weights where linear DFlash first accepted their goal: "weak" where the field's K2.6
figures put a DFlash drafter on real text, "weaker" below it, "mid" above. --redraft trains the
drafters anew against a carried target.
Training is reproducible: fixed step counts (the time budget only guards them, and the report
says when it cut one), seeded batches, and torch's deterministic algorithms, so a pair made on
another call or machine of the same kind has the same `pair_sha256` (train_report.json) and
results measured on either belong to one model. --check-determinism makes a small pair twice
and compares them bit for bit.
acceptance.json holds, for every drafter, the exact greedy acceptance of every tree shape along
the served prompts' continuations, both along the walk a server takes and averaged over every
starting point (proving_ground.acceptance), and the rank of the true token at each draft depth.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from proving_ground import corpus, tinymodel, tokenizer
from k26_ddtree.core.acceptance import DraftTopK, TreeShape
from proving_ground.acceptance import CHAIN, acceptance_table, every_start_table, rank_histogram
from proving_ground.matrix import DRAFTER_DIRS

GAP_GOAL = 3.0
# The target trains until its greedy continuations are the text: then they are as aperiodic as
# the source, and a drafter can learn them.
MEMORIZED = 0.95
TARGET_SHARE = 0.6
# Linear DFlash acceptance the field-like drafter stops at: the PCIe box's figures (linear 110
# tok/s at the step cost of b8/k4's 150 at acceptance 4.9) imply about 3.6 for K2.6's drafter.
# The report says whether it landed in the band.
WEAK_GOAL = 3.6
WEAK_BAND = (3.3, 4.0)
WEAKER_GOAL = 2.6
WEAKER_BAND = (2.0, 3.2)
# A third quality above the field's: where a tree still adds tokens but less than over "weak".
MID_GOAL = 5.25


@dataclass(frozen=True)
class GoalDrafter:
    """The drafter's weights where linear DFlash first accepted `goal`: DIR/drafter-NAME."""
    goal: float
    band: tuple[float, float] | None = None  # where its acceptance on every served prompt should land


GOAL_DRAFTERS = {"weaker": GoalDrafter(WEAKER_GOAL, WEAKER_BAND), "weak": GoalDrafter(WEAK_GOAL, WEAK_BAND),
                 "mid": GoalDrafter(MID_GOAL)}
RANKS_KEPT = 8
# The speed configs and the acceptance grid of the proving ground (proving_ground/device/matrix.json).
TREE_SHAPES = [CHAIN, TreeShape(7, 1, True)] + [
    TreeShape(budget, topk, spine) for budget in (8, 16, 32, 64) for topk in (4, 8) for spine in (False, True)
]
# Training windows hold a prompt and its whole continuation, so no served position is untrained.
SEQ_LEN = 512
EVAL_NEW_TOKENS = 96
EVAL_PROMPTS = 8  # the served prompts the target's stop checks look at
# A drafter's checks look at every served prompt: a goal drafter is judged by its band over all
# of them, and 8 prompts' acceptance can differ from that by more than the band.
GREEDY_BATCH = 512


@dataclass(frozen=True)
class Knobs:
    """Training sizes; `SMOKE` shrinks them so a CPU test walks every line in seconds."""
    target_batch: int = 64
    draft_batch: int = 32  # sequences per step; every position of each roots a block
    target_eval_every: int = 200
    target_min_steps: int = 600
    target_max_steps: int = 2000
    draft_eval_every: int = 10  # steps between acceptance checks (a goal drafter is taken at one)
    draft_plateau_evals: int = 10  # checks between the plateau test and the log line
    draft_min_steps: int = 1000
    draft_max_steps: int = 800
    report_new_tokens: int = corpus.CONTINUATION_TOKENS
    eval_new_tokens: int = EVAL_NEW_TOKENS
    corpus_bytes: int = corpus.MAX_BYTES
    seq_len: int = SEQ_LEN
    prompts: int = corpus.PROMPTS
    served: int = corpus.SERVED
    distill: int = 1024  # the target's own continuations the drafters train on


SMOKE = Knobs(target_batch=2, draft_batch=2, target_eval_every=2, target_min_steps=2, target_max_steps=40,
              draft_eval_every=2, draft_plateau_evals=1, draft_min_steps=2, draft_max_steps=40, eval_new_tokens=12,
              report_new_tokens=12, corpus_bytes=60_000, seq_len=64, prompts=8, served=4, distill=8)
# --check-determinism: every kind of step the real pair takes, few of each.
CHECK = Knobs(target_eval_every=50, target_min_steps=0, target_max_steps=100, draft_eval_every=10,
              draft_plateau_evals=2, draft_min_steps=0, draft_max_steps=40, report_new_tokens=64, distill=64)
# What a pair is: its weights, tokenizer and prompts (the reports carry timings, which vary).
PAIR_FILES = ("*/model.safetensors", "target/tokenizer.json", "prompts.json")


def make_deterministic() -> None:
    """Before any CUDA work: cuBLAS needs a fixed workspace to be deterministic, and torch then
    takes deterministic kernels where it has them (gather's backward among them); where it has
    none it warns, and --check-determinism shows what that costs. Attention runs on SDPA's math
    backend: under warn_only every fused backward (flash, memory-efficient, cuDNN) takes its
    non-deterministic path, and on an H100 the pair made twice differed; math's backward is
    matmuls and a softmax, deterministic under the fixed workspace."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)


def pair_digest(out: Path) -> str:
    """SHA256 over the pair's files (PAIR_FILES), each with its path: equal digests, equal models."""
    digest = hashlib.sha256()
    for path in sorted({p for pattern in PAIR_FILES for p in out.glob(pattern)}):
        digest.update(str(path.relative_to(out)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def amp(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def encode_corpus(tok, lines: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for enc in tok.encode_batch([line + "\n" for line in lines]):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


def sample_windows(data: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, length + 1] windows of a token stream [n]."""
    starts = torch.randint(0, data.numel() - length - 1, (batch,), generator=gen)
    return torch.stack([data[s:s + length + 1] for s in starts.tolist()])


@torch.no_grad()
def greedy_continuations(target, prompts: list[list[int]], new_tokens: int, device: torch.device):
    """Greedy tokens (prompt included) and the top-1/top-2 log-prob gap at each generated
    position, by full recompute; prompts of one length run as one batch."""
    seqs: list[list[int] | None] = [None] * len(prompts)
    gaps: list[float] = []
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(i)
    for members in by_length.values():
        for chunk in range(0, len(members), GREEDY_BATCH):
            rows = members[chunk:chunk + GREEDY_BATCH]
            ids = torch.tensor([prompts[i] for i in rows], device=device)
            for _ in range(new_tokens):
                with amp(device):
                    logits, _ = target(ids)
                top2 = logits[:, -1].float().log_softmax(-1).topk(2)
                gaps += (top2.values[:, 0] - top2.values[:, 1]).tolist()
                ids = torch.cat((ids, top2.indices[:, :1]), dim=1)
            for i, row in zip(rows, ids.tolist()):
                seqs[i] = row
    return seqs, gaps


def optimizer_step(opt, loss: torch.Tensor, model) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def text_shares(greedy: list[list[int]], prompts: list[list[int]], offsets: list[int],
                data: torch.Tensor) -> list[float]:
    """Per prompt, the share of its greedy continuation that is the text after the prompt."""
    shares = []
    for seq, prompt, start in zip(greedy, prompts, offsets):
        cont = seq[len(prompt):]
        text = data[start + len(prompt):start + len(prompt) + len(cont)].tolist()
        shares.append(sum(a == b for a, b in zip(cont, text)) / max(1, len(cont)))
    return shares


def train_target(target, data, device, seed: int, deadline: float, prompts, offsets, knobs: Knobs):
    """Train until the target reproduces the text after its eval prompts (those at `offsets`) in
    MEMORIZED of the tokens, with a median top-1/top-2 gap over GAP_GOAL, or the deadline."""
    opt = torch.optim.AdamW(target.parameters(), lr=3e-3, weight_decay=0.0, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    step, gaps, loss, stopped_by = 0, [0.0], float("nan"), "steps"
    while step < knobs.target_max_steps:
        if time.time() >= deadline:
            stopped_by = "time budget"
            break
        batch = sample_windows(data, knobs.target_batch, knobs.seq_len, gen).to(device)
        with amp(device):
            logits, _ = target(batch[:, :-1])
        loss_t = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer_step(opt, loss_t, target)
        step += 1
        if step % knobs.target_eval_every == 0:
            loss = float(loss_t.detach())
            target.eval()
            seqs, gaps = greedy_continuations(target, prompts[:EVAL_PROMPTS], knobs.eval_new_tokens, device)
            target.train()
            same = statistics.mean(text_shares(seqs, prompts, offsets, data))
            log(f"target step {step} loss {loss:.3f} median gap {statistics.median(gaps):.2f} same as text {same:.3f}")
            if statistics.median(gaps) > GAP_GOAL and same >= MEMORIZED and step >= knobs.target_min_steps:
                stopped_by = "goal"
                break
    return {"steps": step, "final_loss": loss, "stopped_by": stopped_by}


def block_logits(target, drafter, windows: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """[b, n, BS - 1, V] float logits of the drafter's blocks rooted at anchors [b, n] of windows
    [b, t], as the server drafts them: the target's features before each root as context, the
    block [root, MASK x (BS - 1)] non-causal, logits through the target's lm_head."""
    device = windows.device
    b, t = windows.shape
    n_blocks = anchors.shape[1]
    bs = tinymodel.BLOCK_SIZE
    with torch.no_grad(), amp(device):
        _, features = target(windows)
    block_pos = (anchors[..., None] + torch.arange(bs, device=device)).view(b, -1)
    block_ids = torch.full_like(block_pos, tinymodel.MASK_TOKEN_ID)
    block_ids.view(b, n_blocks, bs)[..., 0] = windows.gather(1, anchors)
    ctx_pos = torch.arange(t, device=device)
    sees_ctx = ctx_pos.view(1, 1, t) < anchors.repeat_interleave(bs, dim=1)[..., None]
    blk = torch.arange(n_blocks * bs, device=device) // bs
    sees_block = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
    mask = torch.cat((sees_ctx, sees_block), dim=-1)
    embeds = target.model.embed_tokens(block_ids).detach()
    with amp(device):
        hidden = drafter(embeds, block_pos, features, ctx_pos.expand(b, t), mask)
        return target.lm_head(hidden).float().view(b, n_blocks, bs, -1)[:, :, 1:]


def draft_batch(target, drafter, windows):
    """One DFlash training batch: a block rooted at every position of windows [b, t] whose block
    fits, loss on block slots 1..B-1. Every root of a window shares one target forward, so a step
    carries t times the labels of one block per window: a small drafter needs that many to learn
    the text."""
    b, t = windows.shape
    bs = tinymodel.BLOCK_SIZE
    anchors = torch.arange(1, t - bs + 1, device=windows.device).expand(b, -1)
    block_pos = (anchors[..., None] + torch.arange(bs, device=windows.device)).view(b, -1)
    labels = windows.gather(1, block_pos).view(b, -1, bs)[..., 1:]
    return block_logits(target, drafter, windows, anchors), labels


@torch.no_grad()
def draft_topk(target, drafter, seq: list[int], start: int) -> tuple[DraftTopK, torch.Tensor]:
    """The drafter's top-RANKS_KEPT at every root from `start` whose next D + 1 tokens `seq`
    knows, and the rank (1-based) of the true token at each depth: ([A, D] ranks)."""
    device = next(target.parameters()).device
    depth = tinymodel.BLOCK_SIZE - 1
    ids = torch.tensor(seq, device=device)
    anchors = torch.arange(start, len(seq) - depth - 1, device=device)
    logits = block_logits(target, drafter, ids[None], anchors[None])[0].log_softmax(-1)
    truth = ids[anchors[:, None] + 1 + torch.arange(depth + 1, device=device)]
    top = logits.topk(RANKS_KEPT, dim=-1)
    ranks = (logits > logits.gather(2, truth[:, :depth, None])).sum(-1) + 1
    return DraftTopK(tokens=top.indices, logprobs=top.values, truth=truth, roots=ids[anchors]), ranks


def linear_acceptance(target, drafter, greedy_seqs, prompt_lens) -> float:
    """Mean committed tokens per verify step (accepted drafts + bonus) of a linear DFlash walk."""
    topks = [draft_topk(target, drafter, seq, start)[0] for seq, start in zip(greedy_seqs, prompt_lens)]
    return acceptance_table(topks, [CHAIN])[CHAIN.name]


def drafter_report(target, drafter, greedy_seqs, prompt_lens) -> dict:
    """Every tree shape's exact greedy acceptance, along a server's walk and over every starting
    point, and the true token's rank per depth."""
    pairs = [draft_topk(target, drafter, seq, start) for seq, start in zip(greedy_seqs, prompt_lens)]
    topks = [p[0] for p in pairs]
    return {"acceptance": acceptance_table(topks, TREE_SHAPES),
            "acceptance_every_start": every_start_table(topks, TREE_SHAPES),
            "rank_histogram": rank_histogram([p[1] for p in pairs])}


def train_drafter(target, drafter, data, device, seed, deadline, greedy_seqs, prompt_lens, knobs: Knobs,
                  goals: dict[str, float], stop_at_goals: bool = False) -> tuple[dict, dict]:
    """Train on sequences data [N, L] until simulated acceptance stops improving (or, stop_at_goals, every goal is reached),
    keeping a copy of the weights where linear DFlash first accepts each goal: (report,
    {goal name: (state_dict, step)}); a goal never reached is absent."""
    opt = torch.optim.AdamW(drafter.parameters(), lr=2e-3, weight_decay=0.0, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 7)
    step, best, loss, stopped_by = 0, 0.0, float("nan"), "steps"
    snapshots: dict[str, tuple[dict, int]] = {}
    while step < knobs.draft_max_steps:
        if time.time() >= deadline:
            stopped_by = "time budget"
            break
        windows = data[torch.randint(0, data.shape[0], (knobs.draft_batch,), generator=gen)].to(device)
        logits, labels = draft_batch(target, drafter, windows)
        loss_t = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        optimizer_step(opt, loss_t, drafter)
        step += 1
        if step % knobs.draft_eval_every == 0:
            loss = float(loss_t.detach())
            drafter.eval()
            acc = linear_acceptance(target, drafter, greedy_seqs, prompt_lens)
            drafter.train()
            for name, goal in goals.items():
                if name not in snapshots and acc >= goal:
                    snapshots[name] = ({k: v.detach().clone() for k, v in drafter.state_dict().items()}, step)
                    log(f"drafter step {step}: accepts {acc:.2f}, the {name} drafter's goal {goal}")
            if step // knobs.draft_eval_every % knobs.draft_plateau_evals == 0:
                log(f"drafter step {step} loss {loss:.3f} simulated acceptance {acc:.2f}")
                if stop_at_goals and len(snapshots) == len(goals):
                    stopped_by = "goals"
                    break
                if not stop_at_goals and acc <= best + 0.02 and step >= knobs.draft_min_steps:
                    stopped_by = "plateau"
                    break
                best = max(best, acc)
    return {"steps": step, "final_loss": loss, "stopped_by": stopped_by}, snapshots


def new_drafter(seed: int, device):
    drafter = tinymodel.TinyDFlashDrafter(tinymodel.DRAFT_CONFIG)
    tinymodel.init_weights(drafter, seed)
    tinymodel.out_proj_scale(drafter, tinymodel.DRAFT_CONFIG["num_hidden_layers"])
    return drafter.to(device)


def goal_report(name: str, drafter, step: int | None, target, greedy, prompt_lens) -> dict:
    """GOAL_DRAFTERS[name]'s report: its acceptance on every served prompt, whether the training
    reached its goal (at which step) and whether it landed in its band."""
    spec = GOAL_DRAFTERS[name]
    accepts = linear_acceptance(target, drafter, greedy, prompt_lens)
    info = {"simulated_accept_length": accepts, "goal": spec.goal, "reached_goal": step is not None, "step": step}
    if step is None:
        log(f"WARNING: the training never reached the {name} drafter's goal {spec.goal}: it is the last weights")
    if spec.band is not None:
        low, high = spec.band
        info.update(band=list(spec.band), in_band=low <= accepts <= high)
        if not info["in_band"]:
            log(f"WARNING: the {name} drafter accepts {accepts:.2f}, outside {spec.band}")
    return info


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name() if device.type == "cuda" else str(device)


def save_drafter(drafter, tok, out_dir: Path) -> None:
    """Checkpoint and tokenizer, written beside `out_dir` and moved into place: a run stopped
    half-way leaves no drafter folder a server would load."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tinymodel.save_checkpoint(drafter, tinymodel.DRAFT_CONFIG, tmp)
    tokenizer.save_tokenizer(tok, tmp, tinymodel.MAX_POSITIONS)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)


REPORTS = ("acceptance.json", "train_report.json")
ACCEPTANCE_NOTE = ("exact greedy acceptance (committed tokens per step) along the target's continuations of the "
                   "{prompts} served prompts ({tokens} tokens each): 'acceptance' along the walk a server of that "
                   "shape takes, 'acceptance_every_start' averaged over every starting point; rank_histogram: rank "
                   "of the true token per draft depth")


def load_pair(out: Path, device: torch.device):
    """(target, tokenizer, {seed, served, fingerprint} from prompts.json, prompt ids,
    {report file: its JSON}) of a folder make_pair wrote; UserError if it is not one."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    try:
        config = json.loads((out / "target" / "config.json").read_text())
        meta = json.loads((out / "prompts.json").read_text())
        prompts = [list(map(int, p["input_ids"])) for p in meta["prompts"]]
        pair = {"seed": int(meta["seed"]), "served": int(meta["served"]),
                "fingerprint": str(meta["text"]["fingerprint"])}
        reports = {name: json.loads((out / name).read_text()) for name in REPORTS}
        state = load_file(str(out / "target" / "model.safetensors"))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as err:
        raise UserError(f"{out}: not a model folder train wrote ({type(err).__name__}: {err})") from None
    if not prompts or not all(prompts) or not all(0 <= i < tinymodel.VOCAB for p in prompts for i in p):
        raise UserError(f"{out}/prompts.json: expected prompts of token ids in 0..{tinymodel.VOCAB - 1}, none empty")
    bad = [name for name, doc in reports.items() if not isinstance(doc, dict)]
    if bad:
        raise UserError(f"{out}/{bad[0]}: not a JSON object, as train writes it")
    try:
        tok = Tokenizer.from_file(str(out / "target" / "tokenizer.json"))
    except Exception as err:  # tokenizers raises a bare Exception for a missing or broken file
        raise UserError(f"{out}/target/tokenizer.json: {err}") from None
    if config != tinymodel.TARGET_CONFIG:
        raise UserError(f"{out}/target is not the tiny target this code trains (a widened one?)")
    target = tinymodel.TinyDeepseekV3()
    # bf16 on disk, float here: autocast runs the matmuls in bf16 as training did.
    try:
        target.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    except RuntimeError as err:  # missing, extra or misshapen tensors
        raise UserError(f"{out}/target/model.safetensors: not the tiny target's weights "
                        f"({str(err).splitlines()[0]})") from None
    return target.to(device).eval().requires_grad_(False), tok, pair, prompts, reports


def pair_text(out: Path, pair: dict, tok, text_root: Path, knobs: Knobs) -> torch.Tensor:
    """The encoded text the pair in `out` was trained on; UserError if `text_root` holds another."""
    lines = corpus.corpus_lines(text_root, knobs.corpus_bytes)
    if corpus.fingerprint(lines) != pair["fingerprint"]:
        raise UserError(f"{text_root}: not the text {out} was trained on (its fingerprint differs)")
    return encode_corpus(tok, lines)


def add_drafter(out: Path, name: str, time_budget: float, device: torch.device, text_root: Path,
                knobs: Knobs = Knobs(), replace: bool = False) -> dict:
    """Train the goal drafter `name` against the target already in `out` and add it there:
    DIR/drafter-NAME, its acceptance table and its train report entry. An existing drafter of
    that name stays unless `replace`: earlier results were measured with it."""
    t0 = time.time()
    if (out / DRAFTER_DIRS[name]).exists() and not replace:
        raise UserError(f"{out / DRAFTER_DIRS[name]} exists; earlier results were measured with it "
                        "(--replace trains a new one in its place)")
    target, tok, pair, prompts, reports = load_pair(out, device)
    data = pair_text(out, pair, tok, text_root, knobs)
    served = prompts[:pair["served"]]
    prompt_lens = [len(p) for p in served]
    greedy, _ = greedy_continuations(target, served, knobs.report_new_tokens, device)
    _, info, goals = trained_drafters(target, data, greedy, prompt_lens, pair["seed"], t0 + time_budget, device,
                                      knobs, [name], stop_at_goals=True)
    drafter, goal_info = goals[name]
    info.update(goal_info, seconds=round(time.time() - t0, 1), device=device_name(device), torch=torch.__version__)
    log(f"{name} drafter done: {info}")
    reports["acceptance.json"][name] = drafter_report(target, drafter, greedy, prompt_lens)
    reports["train_report.json"][f"drafter_{name}"] = info
    save_drafter(drafter, tok, out / DRAFTER_DIRS[name])
    for file, doc in reports.items():
        if file == "train_report.json":
            write_train_report(out, doc)
        else:
            atomic.write_text(out / file, json.dumps(doc, indent=1) + "\n")
    return info


def continuation_report(greedy: list[list[int]], prompts: list[list[int]], offsets: list[int], data: torch.Tensor,
                        gaps: list[float]) -> dict:
    """Every continuation's shortest period and the share of it that is the text after its prompt."""
    periods = [corpus.shortest_period(seq[len(prompt):]) for seq, prompt in zip(greedy, prompts)]
    same = text_shares(greedy, prompts, offsets, data)
    gaps_sorted = sorted(gaps)
    return {"tokens": len(greedy[0]) - len(prompts[0]), "shortest_period_min": min(periods),
            "periods_under": {str(corpus.MIN_PERIOD): sum(p < corpus.MIN_PERIOD for p in periods)},
            "periods": periods, "share_equal_to_text_mean": round(statistics.mean(same), 4),
            "share_equal_to_text_min": round(min(same), 4), "median_gap": statistics.median(gaps),
            "p10_gap": gaps_sorted[len(gaps) // 10], "min_gap": gaps_sorted[0]}


def distill_set(target, data: torch.Tensor, seed: int, knobs: Knobs, device) -> torch.Tensor:
    """[knobs.distill, PROMPT_TOKENS + report_new_tokens] on `device`: the target's greedy
    continuations of text windows starting anywhere in the text. Drafters learn the target's own
    outputs, as real DFlash drafters do. The served prompts' text is among them: a real drafter
    predicts its target from far more text than it serves, and a drafter this small can only do
    so for text it has seen (bench/results/2026-12-03-text-pair-training). How well it knows the
    text is its goal's acceptance."""
    if data.numel() <= corpus.PROMPT_TOKENS:
        raise UserError(f"the text has {data.numel()} tokens: too few for a {corpus.PROMPT_TOKENS}-token prompt")
    gen = torch.Generator().manual_seed(seed + 11)
    starts = torch.randint(0, data.numel() - corpus.PROMPT_TOKENS, (knobs.distill,), generator=gen).tolist()
    seqs, _ = greedy_continuations(target, [data[s:s + corpus.PROMPT_TOKENS].tolist() for s in starts],
                                   knobs.report_new_tokens, device)
    return torch.tensor(seqs, device=device)


def trained_drafters(target, data: torch.Tensor, greedy: list[list[int]], prompt_lens: list[int], seed: int,
                     deadline: float, device, knobs: Knobs, names: list[str], stop_at_goals: bool = False):
    """One drafter training on the target's own continuations of the text, and the goal drafters
    `names` taken from it, each judged over the served prompts' continuations `greedy`:
    (the trained drafter, its training report, {name: (goal drafter, its goal_report)})."""
    distilled = distill_set(target, data, seed, knobs, device)
    log(f"distilled {tuple(distilled.shape)} sequences")
    drafter = new_drafter(seed + 1, device).train()
    info, snapshots = train_drafter(target, drafter, distilled, device, seed, deadline, greedy, prompt_lens, knobs,
                                    {name: GOAL_DRAFTERS[name].goal for name in names}, stop_at_goals)
    drafter.eval()
    info["distilled"] = list(distilled.shape)
    goals = {}
    for name in names:
        state, step = snapshots.get(name, (drafter.state_dict(), None))
        goal_drafter = new_drafter(seed + 1, device)
        goal_drafter.load_state_dict(state)
        goal_drafter.eval()
        goals[name] = (goal_drafter, goal_report(name, goal_drafter, step, target, greedy, prompt_lens))
        log(f"{name} drafter: {goals[name][1]}")
    return drafter, info, goals


def make_drafters(target, data: torch.Tensor, served: list[list[int]], greedy: list[list[int]],
                  seed: int, deadline: float, device, knobs: Knobs) -> tuple[dict, dict]:
    """The drafter trained for draft_max_steps, or until its acceptance stops improving past
    draft_min_steps ("real"; the deadline only guards),
    and every goal drafter taken from that training; greedy: the served prompts' continuations,
    which judge them. (drafters {name: module}, their reports)."""
    prompt_lens = [len(p) for p in served]
    drafter, info, goals = trained_drafters(target, data, greedy, prompt_lens, seed, deadline, device, knobs,
                                            list(GOAL_DRAFTERS))
    info["simulated_accept_length"] = linear_acceptance(target, drafter, greedy, prompt_lens)
    log(f"drafter done: {info}")
    reports = {"drafter": info} | {f"drafter_{name}": report for name, (_, report) in goals.items()}
    drafters = {"real": drafter} | {name: d for name, (d, _) in goals.items()}
    acceptance = {name: drafter_report(target, d, greedy, prompt_lens) for name, d in drafters.items()}
    return drafters, {"reports": reports, "acceptance": acceptance}


def save_drafters(out: Path, drafters: dict, tok, acceptance: dict, knobs: Knobs) -> None:
    for name, d in drafters.items():
        save_drafter(d, tok, out / DRAFTER_DIRS[name])
    atomic.write_text(out / "acceptance.json", json.dumps(
        {"note": ACCEPTANCE_NOTE.format(prompts=knobs.served, tokens=knobs.report_new_tokens), **acceptance},
        indent=1) + "\n")


def redraft(out: Path, time_budget: float, device: torch.device, text_root: Path, knobs: Knobs = Knobs()) -> dict:
    """Train every drafter anew against the target already in `out`, replacing them and their reports."""
    t0 = time.time()
    target, tok, pair, prompts, reports = load_pair(out, device)
    data = pair_text(out, pair, tok, text_root, knobs)
    served = prompts[:pair["served"]]
    greedy, _ = greedy_continuations(target, served, knobs.report_new_tokens, device)
    drafters, made = make_drafters(target, data, served, greedy, pair["seed"], t0 + time_budget,
                                   device, knobs)
    report = reports["train_report.json"]
    report = {k: v for k, v in report.items() if not k.startswith("drafter")} | made["reports"]
    save_drafters(out, drafters, tok, made["acceptance"], knobs)
    return write_train_report(out, report)


def make_pair(out: Path, seed: int, time_budget: float, device: torch.device, text_root: Path,
              knobs: Knobs = Knobs()) -> dict:
    t0 = time.time()
    lines = corpus.corpus_lines(text_root, knobs.corpus_bytes)
    tok = tokenizer.build_tokenizer(lines, tinymodel.VOCAB)
    data = encode_corpus(tok, lines)
    offsets = corpus.prompt_offsets(data.numel(), knobs.prompts)
    prompts = [data[o:o + corpus.PROMPT_TOKENS].tolist() for o in offsets]
    served = prompts[:knobs.served]
    text = {"root": text_root.name, "fingerprint": corpus.fingerprint(lines), "bytes": sum(map(len, lines)),
            "tokens": data.numel()}
    log(f"text {text}, tokenizer vocab {tok.get_vocab_size()}, {time.time() - t0:.1f}s")

    torch.manual_seed(seed)
    target = tinymodel.TinyDeepseekV3()
    tinymodel.init_weights(target, seed)
    tinymodel.out_proj_scale(target, tinymodel.TARGET_CONFIG["num_hidden_layers"])
    target.to(device).train()
    target_info = train_target(target, data, device, seed, t0 + time_budget * TARGET_SHARE, served, offsets, knobs)
    target.eval().requires_grad_(False)
    greedy, gaps = greedy_continuations(target, prompts, knobs.report_new_tokens, device)
    target_info.update(continuations=continuation_report(greedy, prompts, offsets, data, gaps), gap_goal=GAP_GOAL,
                       seconds=round(time.time() - t0, 1))
    log(f"target done: {dict(target_info, continuations={k: v for k, v in target_info['continuations'].items() if k != 'periods'})}")

    drafters, made = make_drafters(target, data, served, greedy[:knobs.served], seed, t0 + time_budget,
                                   device, knobs)
    report = {"seed": seed, "text": text, "target": target_info, **made["reports"]}

    tinymodel.save_checkpoint(target, tinymodel.TARGET_CONFIG, out / "target")
    tokenizer.save_tokenizer(tok, out / "target", tinymodel.MAX_POSITIONS)
    save_drafters(out, drafters, tok, made["acceptance"], knobs)
    atomic.write_text(out / "prompts.json", json.dumps(
        {"seed": seed, "text": text, "served": knobs.served,
         "prompts": [{"text": tok.decode(ids), "input_ids": ids, "text_offset": o} for ids, o in zip(prompts, offsets)]},
        indent=1) + "\n")
    report.update(torch=torch.__version__, device=device_name(device))
    return write_train_report(out, report)


def write_train_report(out: Path, report: dict) -> dict:
    """train_report.json, last, with the digest of the pair now on disk, and whether a time budget
    cut a training (then another run of the same recipe makes another pair)."""
    cut = [name for name, part in report.items() if isinstance(part, dict) and part.get("stopped_by") == "time budget"]
    report = dict(report, pair_sha256=pair_digest(out), reproducible=not cut, cut_by_time_budget=cut)
    if cut:
        log(f"WARNING: the time budget cut {', '.join(cut)}: this pair is not the recipe's (raise --time-budget)")
    atomic.write_text(out / "train_report.json", json.dumps(report, indent=1) + "\n")
    return report


def check_determinism(out: Path, seed: int, device: torch.device, text_root: Path, knobs: Knobs = CHECK) -> bool:
    """Make the same small pair twice (out/first, out/second) and compare them bit for bit."""
    digests = []
    for name in ("first", "second"):
        shutil.rmtree(out / name, ignore_errors=True)
        (out / name).mkdir(parents=True)
        digests.append(make_pair(out / name, seed, float("inf"), device, text_root, knobs)["pair_sha256"])
    same = digests[0] == digests[1]
    log(f"determinism: the pair made twice is {'bit-identical' if same else 'DIFFERENT'} "
        f"({digests[0][:16]}{'' if same else ' against ' + digests[1][:16]})")
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving_ground.train", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for target/, drafter*/, prompts.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=480.0,
                        help="the most seconds for all the trainings together (--add-drafter: for that one "
                             "drafter); a guard: the recipe's step counts end them, and the report says if it cut one")
    parser.add_argument("--device", default="cuda", help="torch device (cpu: --smoke, or --add-drafter)")
    parser.add_argument("--text-root", type=Path,
                        help="the package folder whose Python source is the text (default: the installed sglang)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the code path, not the model")
    parser.add_argument("--add-drafter", choices=sorted(GOAL_DRAFTERS),
                        help="train only this goal drafter against the target already in --out, and add it there")
    parser.add_argument("--redraft", action="store_true",
                        help="train every drafter anew against the target already in --out, replacing them")
    parser.add_argument("--replace", action="store_true",
                        help="with --add-drafter: train it even where --out already has a drafter of that name")
    parser.add_argument("--check-determinism", action="store_true",
                        help="make a small pair twice under --out and compare them bit for bit (exit 1 if they differ)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        hint = "--device cpu" if args.add_drafter else "--device cpu --smoke for a code-path check"
        print(f"train: no CUDA GPU here (use {hint})", file=sys.stderr)
        return 2
    knobs = SMOKE if args.smoke else Knobs()
    if device.type == "cuda":  # the CPU's kernels are deterministic as they are
        make_deterministic()
    try:
        root = args.text_root or corpus.package_root()
        if args.check_determinism:
            return 0 if check_determinism(args.out, args.seed, device, root, SMOKE if args.smoke else CHECK) else 1
        if args.redraft:
            redraft(args.out, args.time_budget, device, root, knobs)
        elif args.add_drafter:
            add_drafter(args.out, args.add_drafter, args.time_budget, device, root, knobs, args.replace)
        else:
            make_pair(args.out, args.seed, args.time_budget, device, root, knobs)
    except (UserError, FileNotFoundError, ValueError) as err:
        print(f"train: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
