"""The GPU sampling-exactness check's serving path on SGLang 0.5.11's real verify input, on the CPU."""

from __future__ import annotations

from sampling_check_support import check_serving_path, without_gpu_the_check_refuses_in_one_line


def test_the_check_drives_the_verify_input_and_its_control_is_caught(patched_sglang):
    check_serving_path("0.5.11")


def test_without_a_gpu_the_check_refuses_in_one_line():
    without_gpu_the_check_refuses_in_one_line()
