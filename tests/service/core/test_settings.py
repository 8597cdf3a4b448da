"""Settings validation: a bad or unknown ``PATCHSERVE_*`` variable stops start-up with a message that names it."""

from __future__ import annotations

import pytest

from service.core.settings import load_settings, unknown_variables
from tests.service.helpers import run_server


def test_server_with_a_bad_setting_names_the_variable() -> None:
    result = run_server({"PATCHSERVE_MAX_BATCH_SIZE": "0"})
    assert result.returncode == 2
    assert "PATCHSERVE_MAX_BATCH_SIZE" in result.stderr


def test_settings_read_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATCHSERVE_PORT", "9001")
    monkeypatch.setenv("PATCHSERVE_API_KEYS", "a, b")
    monkeypatch.setenv("PATCHSERVE_DEVICE", "cpu")
    settings = load_settings()
    assert settings.port == 9001 and settings.api_keys == ["a", "b"] and settings.device == "cpu"
    monkeypatch.setenv("PATCHSERVE_DEVICE", "tpu")
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert stopped.value.code == 2 and "PATCHSERVE_DEVICE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "variable", ["PATCHSERVE_REQUEST_TIMEOUT", "PATCHSERVE_BODY_TIMEOUT", "PATCHSERVE_SEND_TIMEOUT"]
)
@pytest.mark.parametrize("value", ["inf", "1e400", "nan"])
def test_a_timeout_that_is_not_finite_stops_the_start(monkeypatch, capsys, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert stopped.value.code == 2 and variable in capsys.readouterr().err


def test_a_request_timeout_over_a_day_stops_the_start(monkeypatch, capsys) -> None:
    # 1e303 s passed gt=0, and /v2's model config overflowed converting it to microseconds (a 500)
    monkeypatch.setenv("PATCHSERVE_REQUEST_TIMEOUT", "1e303")
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert stopped.value.code == 2 and "less than or equal to 86400" in capsys.readouterr().err


def test_an_unknown_patchserve_variable_is_named_with_the_setting_it_resembles() -> None:
    environ = {"PATCHSERVE_MAX_BATCH": "8", "PATCHSERVE_PORT": "9000", "PATCHSERVE_ZZZ": "1", "HOME": "/root"}
    assert unknown_variables(environ) == [
        "PATCHSERVE_MAX_BATCH: not a setting, ignored (did you mean PATCHSERVE_MAX_BATCH_SIZE?)",
        "PATCHSERVE_ZZZ: not a setting, ignored",
    ]


@pytest.mark.parametrize(
    "variable, value, says",
    [  # a second ops tester's: the server listened on every interface; drained for ever; polled each millisecond
        ("PATCHSERVE_HOST", "", "at least 1 character"),
        ("PATCHSERVE_MODEL_REPOSITORY", " ", "it is empty"),  # Path("") is the working folder
        ("PATCHSERVE_DRAIN_DELAY", "1e12", "less than or equal to 3600"),
        ("PATCHSERVE_GRACEFUL_SHUTDOWN_TIMEOUT", "99999999", "less than or equal to 86400"),
        ("PATCHSERVE_REPOSITORY_POLL_SECONDS", "0.001", "0 (no polling) or at least 0.1"),
    ],
)
def test_an_empty_host_or_a_shutdown_or_poll_time_past_any_use_stops_the_start(
    monkeypatch, capsys, variable: str, value: str, says: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and variable in error and says in error


def test_polling_may_be_off_or_a_tenth_of_a_second(monkeypatch) -> None:
    for value in ("0", "0.1"):
        monkeypatch.setenv("PATCHSERVE_REPOSITORY_POLL_SECONDS", value)
        assert load_settings().repository_poll_seconds == float(value)


@pytest.mark.parametrize(
    "variable, value",
    [  # an ops tester's: accepted, then an OverflowError after the models loaded, or 500,000 threads on 2 cores
        ("PATCHSERVE_BACKLOG", "99999999999999"),
        ("PATCHSERVE_INTRA_OP_THREADS", "100000"),
        ("PATCHSERVE_DECODE_THREADS", "100000"),
        ("PATCHSERVE_QUEUE_SIZE", "99999999999999999999"),
        ("PATCHSERVE_MAX_IN_FLIGHT", "99999999999999999999"),
    ],
)
def test_a_count_past_any_use_stops_the_start(monkeypatch, capsys, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert stopped.value.code == 2 and variable in capsys.readouterr().err


def test_a_metrics_folder_that_cannot_be_one_stops_the_start_naming_it(tmp_path) -> None:
    # an ops tester: a traceback and status 1
    taken = tmp_path / "a-file"
    taken.write_text("")
    result = run_server({"PROMETHEUS_MULTIPROC_DIR": str(taken)})
    assert result.returncode == 2, result.stderr
    assert "cannot start: PROMETHEUS_MULTIPROC_DIR=" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", [",", ",,", " , ", "   ", "\t"])
def test_api_keys_set_to_only_commas_stop_the_start(monkeypatch, capsys, value: str) -> None:
    """Authentication asked for but given no key is not turned off without a word (a tester's ``,,``)."""
    monkeypatch.setenv("PATCHSERVE_API_KEYS", value)
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "PATCHSERVE_API_KEYS" in error and "holds no key" in error


def test_empty_api_keys_mean_no_authentication(monkeypatch) -> None:
    monkeypatch.setenv("PATCHSERVE_API_KEYS", "")
    assert load_settings().api_keys == []


def test_cors_origins_set_to_only_commas_stop_the_start(monkeypatch, capsys) -> None:
    # a tester's: "," turned CORS off without a word, where the same for the API keys is refused
    monkeypatch.setenv("PATCHSERVE_CORS_ALLOW_ORIGINS", " , ")
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "PATCHSERVE_CORS_ALLOW_ORIGINS" in error and "holds no origin" in error
    monkeypatch.setenv("PATCHSERVE_CORS_ALLOW_ORIGINS", "")
    assert load_settings().cors_allow_origins == []
