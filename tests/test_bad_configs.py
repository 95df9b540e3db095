"""A config.json that is wrong in any way is one clean InputError, by cause:
encoding, nesting, types, non-finite or implausible sizes, relations between
fields. Each category is generated, not only the case that was reported."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxroof.errors import InputError
from jaxroof.specs import models
from jaxroof.specs.models import MODELS_DIR

BASE = json.loads((MODELS_DIR / "mixtral-8x7b.json").read_text())
SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size", "num_local_experts", "num_experts_per_tok")


def _load(tmp_path, text: str | bytes, name="config.json"):
  path = tmp_path / name
  path.write_bytes(text if isinstance(text, bytes) else text.encode())
  models._load.cache_clear()
  return models.load_model(str(path))


bad_sizes = st.one_of(
    st.integers(max_value=0), st.integers(min_value=10**12, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not (math.isfinite(
        x) and x == int(x) and 1 <= x <= 10**9)), st.text(max_size=5),
    st.lists(st.integers(), max_size=2), st.booleans())


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(SIZE_FIELDS), value=bad_sizes)
def test_a_bad_size_is_refused_naming_the_field(tmp_path_factory, field, value):
  tmp_path = tmp_path_factory.mktemp("cfg")
  with pytest.raises(InputError) as e:  # json writes NaN, Infinity and long ints.
    _load(tmp_path, json.dumps({**BASE, field: value}))
  message = str(e.value)
  assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize("text, needle", [
    (b"\xff\xfe\x00\x01", "not UTF-8"),
    ("[" * 50000 + "]" * 50000, "nested too deeply"),
    ("[1, 2]", "expected a JSON object"),
    ("{", "not valid JSON"),
    (json.dumps({**BASE, "model_type": ["mixtral"]}), "model_type"),
    (json.dumps({**BASE, "num_experts_per_tok": 9}), "num_experts_per_tok=9"),
    (json.dumps({**BASE, "num_key_value_heads": 5}), "num_key_value_heads"),
    (json.dumps({**BASE, "num_hidden_layers": 10**9}), "num_hidden_layers"),
])
def test_each_cause_is_one_clean_error(tmp_path, text, needle):
  with pytest.raises(InputError, match=needle):
    _load(tmp_path, text)


def test_a_fifo_or_a_folder_is_not_a_missing_file(tmp_path):
  import os
  fifo = tmp_path / "fifo.json"
  os.mkfifo(fifo)
  with pytest.raises(InputError, match="not a regular file"):
    models.load_model(str(fifo))
  with pytest.raises(InputError, match="folder without a config.json"):
    models.load_model(str(tmp_path))
