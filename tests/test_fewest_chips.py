"""The layout answers the report shows: the fewest chips that hold a model, and one
stream spread over tensor-parallel chips (`jaxroof.parallel.fewest_chips`)."""

from __future__ import annotations

import pytest

from jaxroof.parallel import fewest_chips
from jaxroof.parallel.layout import Layout
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model

H100 = "h100-sxm"
CONTEXT = 8192


def test_a_model_that_fits_one_chip_takes_one():
  # 8.03e9 bf16 weights (16.1 GB) and one 8k sequence (1.07 GB) fit 72 GB (80 GB less 10%).
  layout = fewest_chips.fewest_chips(load_model("llama-3-8b"), load_accelerator(H100),
                                     context=CONTEXT)
  assert layout == Layout()


def test_seventy_billion_weights_take_two_h100s():
  # 70.6e9 bf16 weights (141 GB) pass one chip's 72 GB; half of them and half of one 8k
  # sequence's K/V (8192 x 327,680 B) fit two.
  layout = fewest_chips.fewest_chips(load_model("llama-3.1-70b"), load_accelerator(H100),
                                     context=CONTEXT)
  assert (layout.tp, layout.pp, layout.ep, layout.chips_per_replica) == (2, 1, 1, 2)


def test_the_grid_is_the_search_per_model_and_accelerator():
  devices = [load_accelerator(H100), load_accelerator("tpu-v5e")]
  specs = {"llama-3-8b": load_model("llama-3-8b")}
  grid = fewest_chips.fewest_chips_grid(specs, devices, context=CONTEXT)
  assert grid == {
      "llama-3-8b": {
          d.name: fewest_chips.fewest_chips(specs["llama-3-8b"], d, context=CONTEXT) for d in devices
      }
  }
  # 16.1 GB of weights pass a 16 GB TPU v5e: more than one chip.
  assert grid["llama-3-8b"]["tpu-v5e"].chips_per_replica >= 2


def test_allreduces_per_token_are_two_per_block_and_one_for_the_embedding():
  # Llama 3.1 70B has 80 blocks (its config.json's num_hidden_layers).
  assert fewest_chips.tp_allreduces_per_token(load_model("llama-3.1-70b")) == 2 * 80 + 1


def test_single_stream_70b_on_the_fewest_h100s():
  rows = fewest_chips.single_stream(load_model("llama-3.1-70b"), load_accelerator(H100),
                                    context=CONTEXT)
  assert [r["tp"] for r in rows] == [1, 2, 4, 8]
  fewest = next(r for r in rows if r["fits_in_memory"])
  assert fewest["tp"] == 2
  # By hand: two chips at 3.35 TB/s each stream 141.1e9 B of weights and 8192 x 327,680 B of
  # K/V between them (the embedding table is looked up, not streamed: a bit faster), plus
  # 2 x 80 + 1 one-shot all-reduces of one token's activations at NCCL's 6.6 us base and
  # one 0.6 us NVLink step each.
  by_hand = 1 / ((141.1e9 + 8192 * 327680) / (2 * 3.35e12) + 161 * (6.6e-6 + 0.6e-6))
  assert fewest["per_sequence_tokens_per_s"] == pytest.approx(by_hand, rel=0.03)
