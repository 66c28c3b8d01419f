"""The GPU sampling-exactness check's serving path on SGLang 0.5.17's real verify input
(DDTreeVerifyInputV2), on the CPU."""

from __future__ import annotations

from sampling_check_support import check_serving_path


def test_the_check_drives_the_v2_verify_input_and_its_control_is_caught(patched_sglang):
    check_serving_path("0.5.17")
