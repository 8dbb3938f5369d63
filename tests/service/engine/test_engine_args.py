"""vLLM's engine arguments on ``tokenmold serve`` / ``generate`` and ``Tokenmold(...)``: a vLLM
command line parses with vLLM's own definitions and reaches vLLM's ``EngineArgs`` (no engine
starts here); what cannot apply is refused with one line. The shared server runs with some of
these flags (``live_api.server_args``; ``test_api_engine_flags.py`` checks their effect)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from tokenmold.service.cli.main import _parser, engine_config
from tokenmold.service.engine.async_engine import EngineConfig, vllm_engine_args
from tokenmold.service.errors import BadInput


def serve(*flags: str) -> argparse.Namespace:
    return _parser().parse_args(["serve", *flags])


def built(args: argparse.Namespace, model_path: str, **config):
    return vllm_engine_args(engine_config(args, **config), model_path)


def test_a_vllm_command_line_reaches_the_engine_arguments(model_path: str) -> None:
    speculative = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    args = serve(
        "--gpu-memory-utilization", "0.5",
        "--quantization", "fp8",
        "--kv-cache-dtype", "fp8",
        "--enable-prefix-caching",
        "--max-num-batched-tokens", "1024",
        "--pipeline-parallel-size", "2",
        "--distributed-executor-backend", "mp",
        "--enable-lora",
        "--speculative-config", json.dumps(speculative),
        "--max_num_seqs", "8",  # vLLM's spelling with underscores
        "--seed", "7",  # serve has no --seed of its own: vLLM's engine seed
        "--max-model-len", "2k",  # vLLM's human-readable numbers
    )  # fmt: skip
    engine = built(args, model_path)
    assert engine.gpu_memory_utilization == 0.5 and engine.quantization == "fp8" and engine.kv_cache_dtype == "fp8"
    assert engine.enable_prefix_caching is True and engine.max_num_batched_tokens == 1024
    assert engine.pipeline_parallel_size == 2 and engine.distributed_executor_backend == "mp"
    assert engine.enable_lora is True and engine.speculative_config == speculative
    assert engine.max_num_seqs == 8 and engine.seed == 7 and engine.max_model_len == 2000
    assert engine.model == model_path  # tokenmold's --model, resolved
    assert engine.structured_outputs_config.backend == "xgrammar"  # tokenmold's grammar path stays


def test_without_vllm_flags_tokenmold_defaults_apply(model_path: str) -> None:
    args = serve("--port", "9000")
    assert args.engine_args == {}
    engine = built(args, model_path)
    assert engine.max_num_seqs == EngineConfig.max_num_seqs and engine.enable_prefix_caching is None
    assert engine.speculative_config is None and engine.disable_log_stats is False  # vLLM's metrics on


def test_json_arguments_take_vllm_dot_notation(model_path: str) -> None:
    args = serve("--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "2")
    assert built(args, model_path).speculative_config == {"method": "ngram", "num_speculative_tokens": 2}


def test_the_grammar_cache_reaches_the_engine_beside_vllms_additional_config(tmp_path, model_path: str) -> None:
    from tokenmold.service.vllm_core.xgrammar_store import ENGINE_CONFIG_KEY

    assert ENGINE_CONFIG_KEY not in built(serve(), model_path).additional_config  # none unless asked
    args = serve(
        "--grammar-cache-dir", str(tmp_path),
        "--grammar-cache-mb", "64",
        "--additional-config", json.dumps({"someone_elses": 1}),
    )  # fmt: skip
    extra = built(args, model_path).additional_config
    assert extra == {"someone_elses": 1, ENGINE_CONFIG_KEY: {"directory": str(tmp_path), "capacity_bytes": 64 * 2**20}}
    from_python = vllm_engine_args(EngineConfig(grammar_cache_dir=tmp_path), model_path).additional_config
    assert from_python[ENGINE_CONFIG_KEY]["directory"] == str(tmp_path)  # a Path too: vLLM hashes it as JSON


def test_a_vllm_config_file_is_read(tmp_path) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("max-num-seqs: 4\nenable-prefix-caching: true\n")
    assert serve("--config", str(config)).engine_args == {"max_num_seqs": 4, "enable_prefix_caching": True}


def test_generate_keeps_its_own_seed_and_dtype(model_path: str) -> None:
    args = _parser().parse_args(
        ["generate", "--choice", "a,b", "--prompt", "x", "--seed", "3", "--dtype", "float32", "--max-model-len", "512"]
    )
    assert args.seed == 3 and "seed" not in args.engine_args  # the sampling seed, not vLLM's engine seed
    engine = built(args, model_path)
    assert engine.seed == EngineConfig.seed and engine.dtype == "float32" and engine.max_model_len == 512


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--tokenizer", "gpt2"], "--tokenizer cannot apply"),
        (["--structured-outputs-config.backend", "guidance"], "--structured-outputs-config cannot apply"),
        (["--runner", "pooling"], "--runner cannot apply"),
        (["--speculative-config.method", "ngram", "--forced-drafts", "2"], "--speculative-config and --forced-drafts"),
    ],
)
def test_what_cannot_apply_is_refused_with_one_line(flags: list[str], named: str) -> None:
    args = serve(*flags)
    with pytest.raises(BadInput, match=named) as refused:
        engine_config(args, forced_drafts=args.forced_drafts)
    assert "\n" not in str(refused.value)


def test_harmless_values_of_those_flags_pass(model_path: str) -> None:
    assert built(serve("--runner", "generate", "--convert", "none"), model_path).runner == "generate"


def test_vllm_tool_call_parsers_map_onto_tokenmold_formats(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve("--tool-call-parser", "llama3_json").tool_call_format == "llama3_json"
    assert serve("--tool-call-parser", "qwen3_coder").tool_call_format == "qwen3_coder"
    with pytest.raises(SystemExit):
        serve("--tool-call-parser", "pythonic")
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "invalid choice: 'pythonic'" in error and "llama3_json" in error
    # Every family by vLLM's parser name, under both flags and in --help.
    families = {"hermes", "qwen3_coder", "llama3_json", "llama4_pythonic", "mistral", "deepseek_v31", "kimi_k2"}
    families |= {"glm45", "openai", "granite", "minimax_m2", "deepseek_v3", "glm47"}
    help_text = " ".join(_parser()._subparsers._group_actions[0].choices["serve"].format_help().split())  # type: ignore[union-attr]
    for name in families:
        assert name in help_text
        assert (
            serve("--tool-call-format", name).tool_call_format
            == serve("--tool-call-parser", name).tool_call_format
            == name
        )


def test_serve_help_names_every_engine_argument() -> None:
    """Against vLLM's own list: every engine argument's flags, but those tokenmold has of its own."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve_parser = _parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = serve_parser.format_help()
    own = {"--model", "--dtype", "--reasoning-parser", "--served-model-name", "--log-level", "-h", "--help"}
    reference = FlexibleArgumentParser()
    AsyncEngineArgs.add_cli_args(reference)
    fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    flags = [
        flag
        for action in reference._actions
        if action.dest in fields and not own & set(action.option_strings)
        for flag in action.option_strings
    ]
    assert len(flags) > 250
    assert [flag for flag in flags if flag not in text] == []
    assert "--enable-prefix-caching" in text and "--forced-drafts" in text


def test_python_keyword_arguments_are_engine_arguments() -> None:
    config = EngineConfig().with_args(enable_prefix_caching=True, max_model_len=512, grammar_cache_dir="/srv/g")
    assert config.max_model_len == 512 and config.engine_args == {"enable_prefix_caching": True}
    assert config.grammar_cache_dir == "/srv/g"  # Tokenmold(grammar_cache_dir=...): tokenmold's own field
    with pytest.raises(TypeError, match="enable_prefix_cachin"):
        EngineConfig().with_args(enable_prefix_cachin=True)
    with pytest.raises(ValueError, match="--tokenizer cannot apply"):
        EngineConfig().with_args(tokenizer="gpt2")


def test_the_chat_template_is_read_as_vllm_reads_it(tmp_path, model_path: str) -> None:
    from tokenmold.service.engine.model_info import ModelInfo
    from tokenmold.service.request.runtime import _chat_template

    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(template)
    assert _chat_template(str(path)) == template and _chat_template(template) == template
    info = ModelInfo.load(model_path, chat_template=_chat_template(str(path)))
    rendered = info.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "[user] hi\n"
    with pytest.raises(ValueError, match="--chat-template"):
        _chat_template(str(tmp_path / "missing"))
