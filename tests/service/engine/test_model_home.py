"""The embedded model's one-time conversion and the stop-token set derived from it."""

from __future__ import annotations

import json
from pathlib import Path

from tokenmold.service.engine.model_home import ensure_default_model
from tokenmold.service.engine.model_info import ModelInfo, stop_token_ids


def test_converted_folder_is_complete_and_reused(model_path: str) -> None:
    folder = Path(model_path)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "chat_template.jinja"):
        assert (folder / name).exists(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "bfloat16"
    assert "quantization_config" not in config
    mtime = (folder / "model.safetensors").stat().st_mtime
    assert ensure_default_model() == folder  # second call: no reconversion
    assert (folder / "model.safetensors").stat().st_mtime == mtime


def test_model_info_lists_every_end_of_sequence_id(model_path: str) -> None:
    info = ModelInfo.load(model_path)
    assert info.vocab_size == 49152
    im_end, end_of_text = (info.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert set(info.stop_token_ids) == {im_end, end_of_text}


class _Tok:
    eos_token_id = 7
    chat_template = "{{ '<|eot_id|>' }}"

    def get_vocab(self) -> dict[str, int]:
        return {"<|eot_id|>": 9, "<|end_of_text|>": 8, "</s>": 3}


def test_stop_token_ids_union_of_sources() -> None:
    # EOS, the generation config's list, and the chat template's end-of-turn token.
    assert stop_token_ids(_Tok(), [8]) == [7, 8, 9]
    assert stop_token_ids(_Tok(), 8) == [7, 8, 9]
    assert stop_token_ids(_Tok(), None) == [7, 9]
