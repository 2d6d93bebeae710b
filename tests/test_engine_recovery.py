"""Engine auto-recovery's settings (serving/recovery.py), under the AWS vLLM image's names: the launcher reads them,
refuses a bad value at once, and hands them to the engine's process, whose environment then keeps vLLM's HTTP server
up through an engine death. What recovery does against the real engine: tests/test_lmi_engine_death.py."""
from __future__ import annotations

import pytest

from serving.launcher import plan
from serving.recovery import KEEP_ALIVE_ENV, Recovery, keep_alive_environment


@pytest.mark.parametrize("name, value", [("ENGINE_MAX_START_RETRIES", "-1"), ("ENGINE_AUTO_RECOVERY", "maybe")])
def test_a_bad_value_stops_the_start_naming_the_setting(launcher_main, tmp_path, name, value):
    rc, out, err = launcher_main({name: value, "SERVING_MODEL_DIR": str(tmp_path / "none")}, ["--dry-run"])
    assert rc == 2, out + err
    assert name in err and repr(value) in err, err


@pytest.mark.parametrize("env, enabled, retries", [({}, True, 3),
                                                   ({"ENGINE_AUTO_RECOVERY": "false"}, False, 3),
                                                   ({"ENGINE_MAX_START_RETRIES": "1"}, True, 1)])
def test_the_engine_process_gets_the_settings_and_keeps_its_server_up_where_recovery_is_on(
        va, tmp_path, env, enabled, retries):
    engine_env = plan({**env, "SERVING_MODEL_DIR": str(tmp_path / "none")}, va).env
    recovery = Recovery.from_env(engine_env)
    assert (recovery.enabled, recovery.max_start_retries, recovery.left) == (enabled, retries,
                                                                               retries if enabled else 0)
    assert keep_alive_environment(engine_env, ["serve", "m"]) == ({KEEP_ALIVE_ENV: "1"} if enabled else {})


@pytest.mark.parametrize("argv, keeps_alive", [(["serve", "m"], True),
                                               (["serve", "m", "--api-server-count", "1"], True),
                                               (["serve", "m", "--api-server-count=2"], False),
                                               (["serve", "m", "--data-parallel-size", "2"], False)])
def test_vllm_keeps_its_server_up_through_an_engine_death_only_where_recovery_can_apply(argv, keeps_alive):
    """One API server process owns its engine, which recovery starts again; under several, vLLM's own stop stays."""
    assert keep_alive_environment({}, argv) == ({KEEP_ALIVE_ENV: "1"} if keeps_alive else {})


def test_the_recovery_timer_refuses_no_kills():
    from bench.http import recovery_time

    with pytest.raises(SystemExit) as e:
        recovery_time.main(["--kills", "0"])
    assert e.value.code == 2
