"""Pure pieces of deploy: server flags from --help, unit quoting, release ids, probe parsing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.config.recipes import Runtime
from edgekit.engines.llamacpp.args import server_args
from edgekit.errors import EdgekitError
from edgekit.models.footprint import KvLayout
from edgekit.release.plan import plan_release
from edgekit.remote.probe import jetpack_for, parse_l4t, parse_probe

HELP_2026 = """
-m,    --model FNAME                    model path
-c,    --ctx-size N                     size of the prompt context
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM
-np,   --parallel N                     number of server slots
--host HOST                             ip address to listen
--port PORT                             port to listen
-t,    --threads N                      number of CPU threads
--spec-type [none|draft-simple|draft-eagle3|draft-mtp|draft-dflash|draft-dspark|ngram-simple|ngram-map-k]
-md,   --spec-draft-model FNAME         draft model
--spec-draft-n-max N                    number of tokens to draft (default: 3)
--spec-draft-n-min N                    minimum number of draft tokens
--spec-draft-p-min P                    minimum speculative decoding probability
-ngld, --spec-draft-ngl N               layers of the draft model in VRAM
--no-webui                              disable the Web UI
--metrics                               enable prometheus compatible metrics endpoint
-fa,   --flash-attn [on|off|auto]       set Flash Attention use
-ctk,  --cache-type-k TYPE              KV cache data type for K
-ctv,  --cache-type-v TYPE              KV cache data type for V
-ctkd, --spec-draft-type-k TYPE         KV cache data type for K for the draft model
-ctvd, --spec-draft-type-v TYPE         KV cache data type for V for the draft model
"""
HELP_OLD = HELP_2026.replace("--spec-draft-n-max", "--draft-max").replace("-md,   --spec-draft-model",
                                                                            "-md,   --model-draft")


def test_server_args_use_the_binarys_spelling() -> None:
    rt = Runtime(spec_type="draft-mtp", draft_n_max=4, ctx_size=2048, parallel=2, port=9000,
                 llama_cpp={"n_gpu_layers": 99})
    args = server_args(rt, HELP_2026, "models/target.gguf", "models/drafter.gguf", port=9100)
    joined = " ".join(args)
    assert "-m models/target.gguf" in joined and "-md models/drafter.gguf" in joined
    assert "--spec-type draft-mtp --spec-draft-n-max 4" in joined and "-ngld 99" in joined
    assert "--port 9100" in joined and "-c 2048" in joined and "-np 2" in joined
    old = " ".join(server_args(rt, HELP_OLD, "t.gguf", "d.gguf", port=1))
    assert "--draft-max 4" in old and "--spec-draft-n-max" not in old


def test_server_args_refuse_unknown_spec_type_and_flags() -> None:
    rt = Runtime(spec_type="draft-mtp")
    with pytest.raises(EdgekitError, match="does not know --spec-type draft-mtp"):
        server_args(rt, HELP_2026.replace("draft-mtp|", ""), "t", "d", 1)
    with pytest.raises(EdgekitError, match="knows none of"):
        server_args(Runtime(), "--model only", "t", None, 1)


def test_release_id_is_stable_and_content_addressed(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"binary")
    (tmp_path / "m").write_bytes(b"model")
    files = {"bin/llama-server": tmp_path / "a", "models/target.gguf": tmp_path / "m"}
    p1 = plan_release("r", files, {"args": ["-m", "x"]}, lambda rid: {"unit": f"id={rid}"})
    p2 = plan_release("r", files, {"args": ["-m", "x"]}, lambda rid: {"unit": f"id={rid}"})
    p3 = plan_release("r", files, {"args": ["-m", "y"]})
    assert p1.release_id == p2.release_id != p3.release_id
    assert p1.files["bin/llama-server"].executable and not p1.files["models/target.gguf"].executable
    assert {"bin/llama-server", "models/target.gguf", "unit", "release.json"} == set(p1.files)


def test_probe_parsing() -> None:
    assert parse_l4t("# R36 (release), REVISION: 4.3, GCID: 1, BOARD: generic, EABI: aarch64") == "36.4.3"
    assert jetpack_for("36.4.3") == "6.2" and jetpack_for("38.2.0") == "7.0" and jetpack_for("35.9.9") == "5"
    facts = parse_probe("b", "\n".join([
        "l4t=# R38 (release), REVISION: 2.0, GCID: 1",
        "model=NVIDIA Jetson AGX Thor Developer Kit",
        'cuda_json={"cuda": {"name": "CUDA SDK", "version": "13.0.48"}}',
        "arch=aarch64", "mem_total_kb=131072000", "disk_free_kb=2048000", "python=3.12.3",
        "jtop_socket=0", "rail=ina238:2-0044:hwmon3:1:VIN", "base=/home/u/edgekit", "base_exists=1",
    ]))
    assert (facts.l4t, facts.jetpack, facts.cuda, facts.mem_total_mb, facts.disk_free_mb) == (
        "38.2.0", "7.0", "13.0.48", 128000, 2000)
    assert [r.label for r in facts.power_rails] == ["VIN"] and facts.is_jetson


def test_guards_for_known_orin_bugs_apply_as_data_and_only_where_they_bite() -> None:
    from pydantic import ValidationError

    from edgekit.engines.llamacpp.quirks import apply_guards
    from edgekit.engines.llamacpp.settings import of

    mtp = Runtime(spec_type="draft-mtp", llama_cpp={"n_gpu_layers": 99},
                  env={"CUDA_SCALE_LAUNCH_QUEUES": "4x", "OTHER": "1"})
    rt, applied = apply_guards(mtp, "orin-nx-16gb", "0c1e570", has_drafter=True)
    assert [a.id for a in applied] == ["llama.cpp#24457", "llama.cpp#19219"]
    assert of(rt).flash_attn == "off" and rt.env == {"OTHER": "1"} and not any(a.overridden for a in applied)
    args = server_args(rt, HELP_2026, "t.gguf", "d.gguf", 8080)
    assert args[args.index("-fa") + 1] == "off"
    # Thor is not affected; no drafter, or everything on the CPU, means no fattn.cu either.
    assert apply_guards(mtp, "thor", "0c1e570", True)[1] == []
    assert [a.id for a in apply_guards(mtp, "orin", "0c1e570", False)[1]] == ["llama.cpp#19219"]
    cpu = mtp.model_copy(update={"llama_cpp": {"n_gpu_layers": 0, "n_gpu_layers_draft": 0}, "env": {}})
    assert apply_guards(cpu, "orin", "0c1e570", True)[1] == []
    # A recipe overrides a guard only by naming it; the override is reported, nothing is changed.
    allowed = mtp.model_copy(update={"llama_cpp": {"n_gpu_layers": 99, "allow_quirks": ["llama.cpp#24457"]}})
    rt, applied = apply_guards(allowed, "orin", "0c1e570", True)
    assert of(rt).flash_attn == "auto" and applied[0].overridden and "NOT applied" in applied[0].line()
    with pytest.raises(ValidationError, match="not an environment variable name"):
        Runtime(env={"BAD NAME": "1"})


def _facts(arch: str, gpu: str = "", glibc: str = "glibc 2.35") -> object:
    return parse_probe("b", f"arch={arch}\nglibc={glibc}\ngpu_driver={gpu}\n"
                            "l4t=# R36 (release), REVISION: 4.3, GCID: 1, BOARD: generic, EABI: aarch64\n")


def test_each_board_gets_the_build_its_hardware_can_run() -> None:
    from edgekit.config.boardfile import Board
    from edgekit.engines.llamacpp.engine import choose_build

    board = Board(host="127.0.0.1", user="nvidia", profile="orin-agx-64gb", base="~/edgekit")
    assert choose_build(board, _facts("x86_64"), "auto").target == "host"
    jetson = choose_build(board, _facts("aarch64", "/dev/nvgpu/igpu0/ctrl"), "auto")
    assert (jetson.target, jetson.cpu_only, jetson.gpu) == ("orin-agx-64gb", False, "required")
    emulated = choose_build(board, _facts("aarch64"), "auto")
    assert (emulated.cpu_only, emulated.gpu) == (True, "none") and "no GPU driver" in (emulated.note or "")
    forced = choose_build(board, _facts("aarch64"), "on")
    assert (forced.cpu_only, forced.gpu) == (False, "optional")
    assert choose_build(board, _facts("aarch64", "/dev/nvidia0"), "off").cpu_only
    with pytest.raises(EdgekitError, match="not one edgekit builds for"):
        choose_build(board, _facts("riscv64"), "auto")


def test_gpu_use_comes_from_the_last_server_start_in_the_log() -> None:
    from edgekit.agent.health import gpu_policy, gpu_use

    found = "ggml_cuda_init: found 1 CUDA devices:\n  Device 0: Orin, compute capability 8.7\n"
    failed = "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version\n"
    assert gpu_use(found) == (True, "used (1 CUDA device)")
    used, why = gpu_use(found + failed)  # the log is appended to: the last start counts
    assert not used and why.startswith("not used: CUDA driver version is insufficient")
    assert not gpu_use("")[0]
    said, failure = gpu_policy("optional", failed)  # reported, not failed
    assert said.startswith("not used: CUDA driver") and failure == ""
    said, failure = gpu_policy("required", failed)
    assert failure.startswith("the GPU was not used")
    assert gpu_policy("none", failed) == (None, "")
    assert gpu_policy("required", found) == ("used (1 CUDA device)", "")


def test_binaries_newer_than_the_boards_glibc_are_refused() -> None:
    from edgekit.engines.llamacpp.engine import check_glibc

    manifest = {"verify": {"glibc_needed": "2.34"}}
    check_glibc(manifest, _facts("aarch64", glibc="glibc 2.35"))
    check_glibc(manifest, _facts("aarch64", glibc=""))  # unknown: the build's own JetPack check stands
    with pytest.raises(EdgekitError, match=r"need GLIBC 2.34, but board 'b' has glibc 2.31; nothing was sent"):
        check_glibc(manifest, _facts("aarch64", glibc="glibc 2.31"))


def test_exec_opens_the_log_and_reads_the_key_file_as_its_own_user_then_becomes_the_program(tmp_path: Path) -> None:
    agent = Path(__file__).parents[1] / "edgekit/agent/edgekit_agent.py"
    (tmp_path / "api.env").write_text("# the key\nVLLM_API_KEY='s3cret'\n")
    log = tmp_path / "server.log"
    log.write_text("earlier\n")
    res = subprocess.run([sys.executable, "-B", str(agent), "exec", "--log", str(log), "--env-file",
                          str(tmp_path / "api.env"), "--", "sh", "-c", 'echo "key=$VLLM_API_KEY pid=$$"; echo e >&2'],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == ""
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier" and lines[1].startswith("key=s3cret pid=") and lines[2] == "e"
    missing = subprocess.run([sys.executable, "-B", str(agent), "exec", "--log", str(log), "--", "/nonexistent"],
                             check=False)
    assert missing.returncode == 127 and "cannot run /nonexistent" in log.read_text()


def test_kv_cache_types_are_llama_cpp_settings_passed_counted_and_checked_against_the_guards() -> None:
    from pydantic import ValidationError

    from edgekit.engines.llamacpp.quirks import apply_guards
    from edgekit.engines.llamacpp.settings import LlamaCppSettings

    q8 = Runtime(spec_type="draft-mtp", llama_cpp={"cache_type_k": "q8_0", "cache_type_v": "q8_0"})
    args = server_args(q8, HELP_2026, "t.gguf", "d.gguf", 8080)
    assert [args[args.index(f) + 1] for f in ("-ctk", "-ctv", "-ctkd", "-ctvd")] == ["q8_0"] * 4
    assert "-ctkd" not in server_args(q8, HELP_2026, "t.gguf", None, 8080)  # no drafter: no drafter's cache
    assert not {"-ctk", "-ctv"} & set(server_args(Runtime(), HELP_2026, "t.gguf", None, 8080))  # f16: as before
    # bytes per value: f16 2, q8_0 34/32, q4_0 18/32 (ggml's blocks of 32)
    one_k = 1 << 20
    def kv_bytes(settings: LlamaCppSettings) -> int:
        return KvLayout(one_k, one_k, 0, 0, 0).in_bytes(*settings.kv_type_bytes).per_token_upper

    assert kv_bytes(LlamaCppSettings()) == 4 * one_k
    assert kv_bytes(LlamaCppSettings(cache_type_k="q8_0", cache_type_v="q8_0")) == 34 * one_k // 16
    assert kv_bytes(LlamaCppSettings(cache_type_k="q4_0", cache_type_v="f16")) == (18 + 64) * one_k // 32
    with pytest.raises(ValidationError, match=r"quantized V cache \(cache_type_v: q4_0\) needs flash attention"):
        LlamaCppSettings(cache_type_v="q4_0", flash_attn="off")
    # On Orin, drafting with MTP on the GPU turns flash attention off (llama.cpp#24457): a quantized V cache is
    # refused in one sentence; a quantized K cache is served.
    gpu = {"n_gpu_layers": 99, "cache_type_v": "q8_0"}
    with pytest.raises(EdgekitError, match=r"Guard llama\.cpp#24457 .* conflicts with runtime\.llama_cpp: a "
                                           r"quantized V cache \(cache_type_v: q8_0\) needs flash attention"):
        apply_guards(Runtime(spec_type="draft-mtp", llama_cpp=gpu), "orin", "0c1e570", has_drafter=True)
    k_only = Runtime(spec_type="draft-mtp", llama_cpp={"n_gpu_layers": 99, "cache_type_k": "q8_0"})
    rt, _ = apply_guards(k_only, "orin", "0c1e570", has_drafter=True)
    args = server_args(rt, HELP_2026, "t.gguf", "d.gguf", 8080)
    assert args[args.index("-fa") + 1] == "off" and args[args.index("-ctk") + 1] == "q8_0" and "-ctv" not in args


def test_tune_puts_a_kv_cache_type_on_the_drafter_its_drafts_and_the_baseline() -> None:
    from edgekit.engines.benchconf import ServerConfig
    from edgekit.engines.llamacpp.bench import get, with_kv_cache

    drafter = ServerConfig("drafter", ["-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-mtp"], True, {})
    out = with_kv_cache(drafter, "q8_0")
    assert [get(out.args, f) for f in ("cache_type_k", "cache_type_v", "cache_type_k_draft", "cache_type_v_draft")] \
        == ["q8_0"] * 4 and (out.settings["cache_type_k"], out.settings["cache_type_v"]) == ("q8_0", "q8_0")
    base = with_kv_cache(ServerConfig("baseline", ["-m", "t.gguf"], False, {}), "q4_0")
    assert get(base.args, "cache_type_v") == "q4_0" and get(base.args, "cache_type_k_draft") is None
    # flash attention off (the Orin guard): a quantized type goes to K alone
    off = with_kv_cache(ServerConfig("drafter", [*drafter.args, "-fa", "off"], True, {}), "q8_0")
    assert (get(off.args, "cache_type_k"), get(off.args, "cache_type_v")) == ("q8_0", "f16")
    assert off.settings["cache_type_v"] == "f16"
