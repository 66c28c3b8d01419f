"""Coding-correctness eval: each task through /v1/chat/completions and /generate, graded in the sandbox."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.bench.cells import CellProgress
from k26_ddtree.bench.client import ServerClient
from k26_ddtree.bench.extract import REASONING_START_MARKERS, Extraction, extract_code, extract_from_chat
from k26_ddtree.bench.isolation import Isolation, detect_isolation
from k26_ddtree.bench.sandbox import run_tests
from k26_ddtree.bench.tasks import CodingTask
from k26_ddtree.errors import UserError

ENDPOINTS = ("chat", "generate")


@dataclass(frozen=True)
class EvalSettings:
    tasks: tuple[CodingTask, ...]
    endpoints: tuple[str, ...]
    max_tokens: int
    temperature: float
    concurrency: int
    test_timeout_s: float
    tokenizer: str | None  # chat template for /generate; None: try the server's own tokenizer path
    allow_unsandboxed: bool = False  # --eval-unsandboxed: without bubblewrap, grade in a plain process

    def __post_init__(self):
        unknown = [e for e in self.endpoints if e not in ENDPOINTS]
        if unknown or not self.endpoints:
            raise UserError(f"--eval-endpoints: choose from {', '.join(ENDPOINTS)} (got {', '.join(self.endpoints)})")


@dataclass(frozen=True)
class _Answer:
    ok: bool
    error: str | None
    extraction: Extraction | None
    completion_tokens: int
    spec_verify_ct: int = 0


class ChatTemplate:
    """Renders the task as the model's chat prompt for /generate (which takes raw text)."""

    def __init__(self, tokenizer, description: str):
        self._tokenizer = tokenizer
        self.description = description

    def render(self, message: str) -> str:
        if self._tokenizer is None:
            return message + "\n"
        return self._tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )


def load_chat_template(explicit: str | None, server_tokenizer_path: str | None) -> ChatTemplate:
    """The tokenizer's chat template: --eval-tokenizer (errors are the user's), else the
    server's tokenizer path when it exists on this machine, else plain text (noted)."""
    local = (server_tokenizer_path if isinstance(server_tokenizer_path, str) and server_tokenizer_path
             and Path(server_tokenizer_path).exists() else None)
    candidate = explicit or local
    if candidate is None:
        return ChatTemplate(None, "plain text (no tokenizer on this machine: pass --eval-tokenizer)")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(candidate, trust_remote_code=True)
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    except Exception as err:  # ImportError or any of transformers' load errors
        if explicit:
            raise UserError(f"cannot use the chat template of {explicit!r}: {type(err).__name__}: {err}") from None
        return ChatTemplate(None, f"plain text (tokenizer {candidate} unusable: {type(err).__name__})")
    return ChatTemplate(tokenizer, f"chat template of {candidate}")


async def _ask_chat(client: ServerClient, model: str, settings: EvalSettings, task: CodingTask) -> _Answer:
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": task.user_message()}],
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
    }
    record = await client.chat(payload)
    if not record.ok:
        return _Answer(False, record.error, None, 0)
    return _Answer(True, None, extract_from_chat(record.message), record.completion_tokens)


async def _ask_generate(
    client: ServerClient, template: ChatTemplate, incremental: bool, settings: EvalSettings, task: CodingTask
) -> _Answer:
    prompt = template.render(task.user_message())
    payload = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": settings.max_tokens, "temperature": settings.temperature},
    }
    record = await client.generate(payload, incremental_text=incremental)
    if not record.ok:
        return _Answer(False, record.error, None, 0)
    reasoning_open = prompt.rstrip().endswith(REASONING_START_MARKERS)
    extraction = extract_code(record.text, reasoning_open)
    return _Answer(True, None, extraction, record.completion_tokens, record.spec_verify_ct)


async def _eval_endpoint(endpoint: str, ask, settings: EvalSettings, isolation: Isolation,
                         progress: CellProgress) -> dict:
    progress.start_cell(f"eval {endpoint}", len(settings.tasks))
    gate = asyncio.Semaphore(settings.concurrency)

    async def one(task: CodingTask) -> _Answer:
        async with gate:
            answer = await ask(task)
        progress.request_done(answer.ok)
        return answer

    started = time.perf_counter()
    answers = await asyncio.gather(*(one(t) for t in settings.tasks))
    duration = time.perf_counter() - started
    results = []
    for task, answer in zip(settings.tasks, answers):
        if not answer.ok:
            passed, reason = False, f"request failed: {answer.error}"
        elif answer.extraction.code is None:
            passed, reason = False, f"no code: {answer.extraction.reason}"
        else:
            outcome = run_tests(answer.extraction.code, task.tests, timeout_s=settings.test_timeout_s,
                                isolation=isolation)
            passed, reason = outcome.passed, outcome.reason
        results.append(
            {
                "task": task.id,
                "passed": passed,
                "reason": reason,
                "code_found": bool(answer.extraction and answer.extraction.code is not None),
                "completion_tokens": answer.completion_tokens,
            }
        )
    tokens = sum(a.completion_tokens for a in answers)
    verify = sum(a.spec_verify_ct for a in answers)
    passed = sum(r["passed"] for r in results)
    summary = {
        "passed": passed,
        "total": len(results),
        "pass_at_1": passed / len(results) if results else None,
        "request_errors": sum(not a.ok for a in answers),
        "completion_tokens": tokens,
        "duration_s": duration,
        "output_tok_s": tokens / duration if duration > 0 else None,
        "accept_length": tokens / verify if verify else None,
        "results": results,
    }
    progress.end_cell(f"pass@1 {passed}/{len(results)}, {summary['output_tok_s'] or 0:.1f} tok/s")
    return summary


async def run_coding_eval(client: ServerClient, settings: EvalSettings, progress: CellProgress) -> dict:
    """The run's `coding_eval` object (schema in bench/results/README.md)."""
    isolation = detect_isolation(settings.allow_unsandboxed)
    result = {
        "tasks": [t.id for t in settings.tasks],
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "sandbox": isolation.note,
        "endpoints": {},
    }
    for endpoint in settings.endpoints:
        if endpoint == "chat":
            model = await client.model_name()
            ask = functools.partial(_ask_chat, client, model, settings)
        else:
            info = await client.model_info()
            template = load_chat_template(settings.tokenizer, info.get("tokenizer_path") or info.get("model_path"))
            result["generate_prompt"] = template.description
            incremental = bool((await client.server_info()).get("incremental_streaming_output"))
            ask = functools.partial(_ask_generate, client, template, incremental, settings)
        result["endpoints"][endpoint] = await _eval_endpoint(endpoint, ask, settings, isolation, progress)
    return result
