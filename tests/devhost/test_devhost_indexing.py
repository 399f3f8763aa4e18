"""The host reads the bindings from the app itself, resolves %SETTINGS%, and refuses what the worker would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from devhost import hostjson, indexing
from devhost import settings as host_settings
from devhost.host import Host, HostError

ROOT = Path(__file__).resolve().parents[2]
FAKE_APP = Path(__file__).resolve().parent / "fake_app"


def test_bindings_come_from_the_apps_decorators_with_settings_resolved(make_host: Callable[..., Host],
                                                                       queues: dict[str, str]) -> None:
    host = make_host(start=False, settings={"TICK_SCHEDULE": "*/5 * * * * *"})
    specs = {s.name: s for s in host.load()}
    assert {name: s.kind for name, s in specs.items()} == {
        "work": "queueTrigger", "nudged": "queueTrigger", "tick": "timerTrigger", "startup": "timerTrigger",
        "events": "eventGridTrigger"}
    work = specs["work"]
    assert (work.trigger.name, work.trigger.queue_name, work.trigger.connection) == (
        "msg", queues["WORK_QUEUE"], "AzureWebJobsStorage")
    assert {(b.name, b.type, b.queue_name) for b in work.outputs} == {
        ("nudge", "queue", queues["NUDGE_QUEUE"]), ("audit", "queue", queues["AUDIT_QUEUE"])}
    assert specs["tick"].trigger.properties["schedule"] == "*/5 * * * * *"
    assert specs["startup"].trigger.properties["runOnStartup"] is True


def test_a_second_host_on_the_same_app_indexes_it_again_without_calling_get_functions_twice(
        make_host: Callable[..., Host]) -> None:
    first = make_host(start=False, settings={"WORK_QUEUE": "one-queue"})
    second = make_host(start=False, settings={"WORK_QUEUE": "other-queue"})
    assert first.load()[0] is not None and second.load()[0] is not None
    assert first.functions["work"].trigger.queue_name == "one-queue"
    assert second.functions["work"].trigger.queue_name == "other-queue"


def test_a_binding_naming_an_unset_setting_is_refused_with_its_name(make_host: Callable[..., Host],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TICK_SCHEDULE", raising=False)
    host = make_host(start=False, settings={"TICK_SCHEDULE": ""})
    with pytest.raises(HostError, match="%TICK_SCHEDULE%"):
        host.load()


def test_an_app_with_two_function_apps_is_refused_like_the_worker_does(tmp_path: Path) -> None:
    (tmp_path / "function_app.py").write_text(
        "import azure.functions as func\napp = func.FunctionApp()\nother = func.FunctionApp()\n")
    with pytest.raises(indexing.IndexingError, match="More than one FunctionApp"):
        indexing.find_app(indexing.import_app_module("function_app", app_dir=tmp_path))


def test_a_parameter_without_a_binding_is_refused_like_the_worker_does(tmp_path: Path) -> None:
    (tmp_path / "function_app.py").write_text(
        "import azure.functions as func\napp = func.FunctionApp()\n"
        "@app.timer_trigger(arg_name='timer', schedule='0 * * * * *')\n"
        "def f(timer: func.TimerRequest, audit_out: func.Out[str]) -> None: ...\n")
    module = indexing.import_app_module("function_app", app_dir=tmp_path)
    with pytest.raises(indexing.IndexingError, match="audit_out"):
        indexing.index(indexing.find_app(module), {})


@pytest.mark.parametrize(("signature", "problem"), [
    pytest.param("msg: func.TimerRequest", 'does not match its Python annotation "TimerRequest"', id="trigger-type"),
    pytest.param("msg: func.QueueMessage, out: str", "not a subclass of azure.functions.Out", id="output-not-out"),
    pytest.param("msg: func.QueueMessage, out: func.Out[int]", 'does not match its Python annotation "int"',
                 id="output-type"),
])
def test_annotations_the_worker_would_refuse_are_refused(tmp_path: Path, signature: str, problem: str) -> None:
    (tmp_path / "function_app.py").write_text(
        "import azure.functions as func\napp = func.FunctionApp()\n"
        "@app.queue_trigger(arg_name='msg', queue_name='q', connection='AzureWebJobsStorage')\n"
        + ("@app.queue_output(arg_name='out', queue_name='o', connection='AzureWebJobsStorage')\n"
           if "out" in signature else "")
        + f"def f({signature}) -> None: ...\n")
    module = indexing.import_app_module("function_app", app_dir=tmp_path)
    with pytest.raises(indexing.IndexingError, match=problem):
        indexing.index(indexing.find_app(module), {})


def test_the_environment_wins_over_local_settings_as_in_core_tools(tmp_path: Path) -> None:
    path = tmp_path / "local.settings.json"
    path.write_text(json.dumps({"IsEncrypted": False, "Values": {"A": "file", "B": "file"}}))
    assert host_settings.load(path, environ={"A": "env"}) == {"A": "env", "B": "file"}


@pytest.mark.parametrize(("document", "problem"), [
    pytest.param("[]", "Values", id="not-an-object"),
    pytest.param('{"IsEncrypted": true, "Values": {}}', "encrypted", id="encrypted"),
    pytest.param("{", "not valid JSON", id="not-json"),
])
def test_a_malformed_settings_file_is_refused(tmp_path: Path, document: str, problem: str) -> None:
    path = tmp_path / "local.settings.json"
    path.write_text(document)
    with pytest.raises(host_settings.SettingsError, match=problem):
        host_settings.read_values(path)


@pytest.mark.parametrize(("text", "seconds"), [
    pytest.param("00:00:30", 30.0, id="thirty-seconds"),
    pytest.param("00:10:00", 600.0, id="ten-minutes"),
    pytest.param("1.02:00:00", 93600.0, id="with-days"),
    pytest.param("00:00:00.100", 0.1, id="fraction"),
    pytest.param("-1", -1.0, id="unbounded"),
])
def test_host_json_timespans_are_read_as_dotnet_does(text: str, seconds: float) -> None:
    assert hostjson.timespan(text, what="x") == pytest.approx(seconds)


@pytest.mark.parametrize(("queues", "problem"), [
    pytest.param({"batchSize": 33}, "batchSize", id="batch-over-32"),
    pytest.param({"maxDequeueCount": 0}, "maxDequeueCount", id="zero-dequeues"),
    pytest.param({"maxPollingInterval": "00:00:00.050"}, "maxPollingInterval", id="polling-under-100ms"),
    pytest.param({"messageEncoding": "utf8"}, "messageEncoding", id="unknown-encoding"),
    pytest.param({"visibilityTimeout": "thirty"}, "visibilityTimeout", id="bad-timespan"),
])
def test_host_json_values_the_host_would_refuse_are_refused(queues: dict[str, object], problem: str) -> None:
    with pytest.raises(hostjson.HostJsonError, match=problem):
        hostjson.parse({"version": "2.0", "extensions": {"queues": queues}})


def test_the_projects_host_json_is_read_with_its_queue_policy() -> None:
    config = hostjson.load(ROOT / "host.json")
    assert config.queues.message_encoding == "base64"
    assert config.queues.max_dequeue_count >= 1 and config.function_timeout_s


def test_defaults_are_the_documented_ones() -> None:
    config = hostjson.parse({"version": "2.0"})
    assert (config.queues.batch_size, config.queues.new_batch_threshold, config.queues.max_dequeue_count,
            config.queues.visibility_timeout_s, config.queues.max_polling_interval_s,
            config.queues.message_encoding) == (16, 8, 5, 0.0, 60.0, "base64")


def test_the_cli_lists_the_functions_it_finds(tmp_path: Path, fake_app: ModuleType) -> None:
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"Values": {"AzureWebJobsStorage": "UseDevelopmentStorage=true",
                                               "WORK_QUEUE": "w", "NUDGE_QUEUE": "n", "AUDIT_QUEUE": "a",
                                               "TICK_SCHEDULE": "0 * * * * *"}}))
    result = subprocess.run([sys.executable, "-m", "devhost", "functions", "--settings", str(settings),
                             "--app-dir", str(FAKE_APP), "--json"], capture_output=True, text=True, cwd=ROOT,
                            timeout=60, check=True)
    listed = {f["name"]: f for f in json.loads(result.stdout)}
    assert set(listed) == {"work", "nudged", "tick", "startup", "events"}
    assert listed["work"]["trigger"]["queueName"] == "w"


def test_the_cli_runs_the_app_for_a_while_and_reports_its_stats(tmp_path: Path, storage_connection_string: str,
                                                                queues: dict[str, str]) -> None:
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"Values": {"AzureWebJobsStorage": storage_connection_string, **queues,
                                               "TICK_SCHEDULE": "* * * * * *"}}))
    stats_file = tmp_path / "stats.json"
    subprocess.run([sys.executable, "-m", "devhost", "run", "--settings", str(settings), "--app-dir", str(FAKE_APP),
                    "--subscriptions", str(FAKE_APP / "eventgrid_subscriptions.json"), "--for", "2.5",
                    "--stats", str(stats_file)], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    stats = json.loads(stats_file.read_text())
    assert stats["functions"]["startup"]["succeeded"] == 1
    assert stats["functions"]["tick"]["succeeded"] >= 1  # every second


def test_a_host_that_cannot_start_leaves_the_apps_clock_as_it_was(make_host: Callable[..., Host],
                                                                 tmp_path: Path) -> None:
    from shared.kernel import clock as clocks
    from shared.kernel.clock import ManualClock

    before = clocks.current()
    (tmp_path / "subs.json").write_text("{}")  # no subscription for the fake app's Event Grid function
    host = make_host(start=False, clock=ManualClock(), eventgrid_subscriptions=tmp_path / "subs.json")
    with pytest.raises(HostError, match="events has an Event Grid trigger but no subscription"):
        host.start()
    assert clocks.current() is before
