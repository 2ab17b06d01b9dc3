"""The core 'reference' profiles must describe the numpy reference model exactly."""

from dualpath_cli.core.profiles import MODEL_PROFILES
from dualpath_cli.core.reference_model import MODEL_CONFIGS


def test_reference_profile_matches_tiny_model() -> None:
    assert MODEL_CONFIGS["tiny"].to_profile("reference") == MODEL_PROFILES["reference"]


def test_reference_bench_profile_matches_bench_model() -> None:
    assert MODEL_CONFIGS["bench"].to_profile("reference-bench") == MODEL_PROFILES["reference-bench"]
