"""Code extraction from thinking-model outputs."""

from __future__ import annotations

from k26_ddtree.bench.extract import extract_code, extract_from_chat, last_code_block, split_answer

DRAFT_IN_REASONING = """<think>
The user wants a function that adds one. A first attempt:

```python
def add_one(x):
    return x - 1  # wrong, will fix
```

Wait, that subtracts. Let me fix it in the answer.
</think>
Here is the function:

```python
def add_one(x):
    return x + 1
```

Usage:

```bash
python -c "print(add_one(1))"
```
"""

KIMI_THINKING = """◁think▷Let me think about the edge cases.
```python
def f():
    return "draft"
```
◁/think▷The final solution:
```py
def f():
    return "final"
```"""

TRUNCATED = """<think>
I need to write merge_intervals. Sort by start, then sweep:

```python
def merge_intervals(intervals):
    return sorted(intervals)
```

Now consider touching intervals such as [1, 2] and [2, 3], they should"""


def test_the_answer_block_wins_over_the_reasoning_draft():
    result = extract_code(DRAFT_IN_REASONING)
    assert result.reason == "ok"
    assert "x + 1" in result.code and "x - 1" not in result.code


def test_kimi_markers():
    result = extract_code(KIMI_THINKING)
    assert result.code.strip() == 'def f():\n    return "final"'


def test_truncated_reasoning_gives_no_code_even_with_a_block_inside():
    result = extract_code(TRUNCATED)
    assert result.code is None and "truncated" in result.reason


def test_template_opened_reasoning_without_any_marker_is_truncated():
    text = "thinking...\n```python\ndef f():\n    pass\n```\n"
    assert extract_code(text, reasoning_open=True).code is None
    assert extract_code(text).code.strip() == "def f():\n    pass"


def test_only_end_marker_when_template_opened_the_block():
    text = "draft:\n```python\nx = 1\n```\n</think>\n\n```python\nx = 2\n```"
    assert extract_code(text, reasoning_open=True).code.strip() == "x = 2"


def test_last_end_marker_counts_when_the_model_thinks_twice():
    text = "<think>a</think>```python\nx = 1\n```<think>b</think>\n```python\nx = 3\n```\n"
    assert extract_code(text).code.strip() == "x = 3"


def test_answer_without_fence_has_no_code():
    result = extract_code("<think>hmm</think>def f():\n    return 1\n")
    assert result.code is None and "no fenced code block" in result.reason


def test_unterminated_final_fence_is_ignored():
    text = "</think>\n```python\nx = 1\n```\nand also\n```python\nx = 2"
    assert extract_code(text).code.strip() == "x = 1"


def test_non_python_block_only_used_when_nothing_else():
    assert last_code_block("```text\nhello\n```").strip() == "hello"
    assert last_code_block("```python\na = 1\n```\n```text\nout\n```").strip() == "a = 1"
    assert last_code_block("````python\nprint('```')\n````").strip() == "print('```')"


def test_split_answer_without_any_reasoning():
    assert split_answer("plain answer") == "plain answer"
    assert split_answer("<think>never closed") is None


def test_chat_with_reasoning_parser_uses_content_only():
    message = {
        "role": "assistant",
        "reasoning_content": "Draft:\n```python\ndef g():\n    return 0\n```\n",
        "content": "Final:\n```python\ndef g():\n    return 1\n```",
    }
    assert "return 1" in extract_from_chat(message).code


def test_chat_with_reasoning_parser_and_cut_off_reasoning():
    message = {"role": "assistant", "reasoning_content": "```python\ndef g():\n    return 0\n```", "content": None}
    result = extract_from_chat(message)
    assert result.code is None and "truncated" in result.reason


def test_chat_without_reasoning_parser_splits_the_markers():
    message = {"role": "assistant", "content": DRAFT_IN_REASONING}
    assert "x + 1" in extract_from_chat(message).code
    assert extract_from_chat({"role": "assistant", "content": TRUNCATED}).code is None
