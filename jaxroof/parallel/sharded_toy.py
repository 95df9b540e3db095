"""The toy Transformer, tensor parallel with `jax.shard_map` over a 1-D `Mesh`.

Prefill and one decode step split the way `jaxroof.symbolic.collectives`
counts them (Megatron): query/K/V heads and the MLP's hidden units across
the "tp" axis, the output and down projections by rows followed by one
`psum` (all-reduce) each; the embedding table and the LM head split by
vocabulary, the lookup a masked gather plus one `psum`, the logits one
`all_gather`. So a pass over R rows makes 2 L + 1 all-reduces of (R, D)
and one all-gather of (R, V), which `collectives` reads back from the
compiled HLO.

Runs on host CPU devices for tests: XLA's `xla_force_host_platform_device_count`
set to N in `XLA_FLAGS` before jax is imported (in a subprocess). Host-device
timings are not interconnect figures.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as Spec

from jaxroof.toy import model as toy_model
from jaxroof.toy.weights import Params, stacked_blocks

AXIS = "tp"

# How each weight splits over the tp axis (None: replicated).
_BLOCK_SPECS = {
    "attn_norm": Spec(),
    "mlp_norm": Spec(),
    "wq": Spec(None, None, AXIS, None),
    "wk": Spec(None, None, AXIS, None),
    "wv": Spec(None, None, AXIS, None),
    "wo": Spec(None, AXIS, None, None),
    "w_up": Spec(None, None, AXIS),
    "w_down": Spec(None, AXIS, None),
}
_KV_SPEC = Spec(None, None, None, AXIS, None)  # (l, b, s, kv heads, e)


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named "tp" over `devices` (default: all)."""
  return Mesh(np.asarray(devices if devices is not None else jax.devices()), (AXIS,))


def _check(params: Params, tp: int) -> None:
  c = params.config
  if c.positions != "rope":
    raise ValueError("the sharded toy supports RoPE positions only")
  for name, value in (("num_heads", c.num_heads), ("num_kv_heads", c.num_kv_heads),
                      ("mlp_dim", c.mlp_dim), ("vocab_size", c.vocab_size)):
    if value % tp:
      raise ValueError(f"tp={tp} does not divide the toy's {name}={value}")


def _weights(params: Params) -> tuple:
  b = stacked_blocks(params)  # Placed once, so stacking costs nothing per step.
  return (params.embed, b.attn_norm, b.wq, b.wk, b.wv, b.wo, b.mlp_norm, b.w_up, b.w_down,
          params.final_norm, params.unembed)


_WEIGHT_SPECS = (Spec(AXIS,
                      None), _BLOCK_SPECS["attn_norm"], _BLOCK_SPECS["wq"], _BLOCK_SPECS["wk"],
                 _BLOCK_SPECS["wv"], _BLOCK_SPECS["wo"], _BLOCK_SPECS["mlp_norm"],
                 _BLOCK_SPECS["w_up"], _BLOCK_SPECS["w_down"], Spec(), Spec(None, AXIS))


def shard_weights(params: Params, mesh: Mesh) -> tuple:
  """The weights placed on the mesh with their `NamedSharding`s."""
  return tuple(
      jax.device_put(w, NamedSharding(mesh, s)) for w, s in zip(_weights(params), _WEIGHT_SPECS))


def _pass(config, weights, ids, k_cache, v_cache, start: int):
  """One tensor-parallel pass over ids (b, t) after `start` cached positions (per device)."""
  (embed, attn_norm, wq, wk, wv, wo, mlp_norm, w_up, w_down, final_norm, unembed) = weights
  rows = embed.shape[0]
  local = ids - lax.axis_index(AXIS) * rows
  inside = (local >= 0) & (local < rows)
  x = jnp.where(inside[..., None], embed[jnp.clip(local, 0, rows - 1)], 0)
  x = lax.psum(x, AXIS)  # Vocabulary-split lookup: 1 all-reduce.
  t = ids.shape[1]
  positions = start + jnp.arange(t)
  keys = jnp.arange(start + t)
  mask = keys[None, :] <= positions[:, None]
  new_k, new_v = [], []
  for layer in range(config.num_blocks):
    h = toy_model._rms_norm(x, attn_norm[layer], config.norm_eps)
    q = toy_model._rope(jnp.einsum("btD,Dhe->bthe", h, wq[layer]), positions, config.rope_base)
    k = toy_model._rope(jnp.einsum("btD,Dke->btke", h, wk[layer]), positions, config.rope_base)
    v = jnp.einsum("btD,Dke->btke", h, wv[layer])
    new_k.append(k)
    new_v.append(v)
    if k_cache is not None:
      k = jnp.concatenate([k_cache[layer], k], axis=1)
      v = jnp.concatenate([v_cache[layer], v], axis=1)
    a = jnp.einsum("bthe,heD->btD", toy_model._attention(q, k, v, mask), wo[layer])
    x = x + lax.psum(a, AXIS)  # Row-split output projection: 1 all-reduce.
    h = toy_model._rms_norm(x, mlp_norm[layer], config.norm_eps)
    m = jnp.einsum("btF,FD->btD", jax.nn.gelu(jnp.einsum("btD,DF->btF", h, w_up[layer])),
                   w_down[layer])
    x = x + lax.psum(m, AXIS)  # Row-split down projection: 1 all-reduce.
  x = toy_model._rms_norm(x, final_norm, config.norm_eps)
  logits = jnp.einsum("btD,DV->btV", x, unembed,
                      preferred_element_type=toy_model._compute_dtype(x.dtype))
  logits = lax.all_gather(logits, AXIS, axis=2, tiled=True)  # Vocabulary-split head.
  return logits, jnp.stack(new_k), jnp.stack(new_v)


def prefill_fn(params: Params, mesh: Mesh):
  """jit(shard_map) prefill: `f(weights, ids) -> (logits (b, t, V), k, v)`."""
  _check(params, mesh.shape[AXIS])
  config = params.config

  def body(weights, ids):
    return _pass(config, weights, ids, None, None, 0)

  return jax.jit(
      jax.shard_map(body, mesh=mesh, in_specs=(_WEIGHT_SPECS, Spec()),
                    out_specs=(Spec(), _KV_SPEC, _KV_SPEC), check_vma=False))


def decode_fn(params: Params, mesh: Mesh, cached: int):
  """jit(shard_map) decode step after `cached` positions:
  `f(weights, token (b,), k, v) -> logits (b, V)`."""
  _check(params, mesh.shape[AXIS])
  config = params.config

  def body(weights, token, k_cache, v_cache):
    logits, _, _ = _pass(config, weights, token[:, None], k_cache, v_cache, cached)
    return logits[:, 0]

  return jax.jit(
      jax.shard_map(body, mesh=mesh, in_specs=(_WEIGHT_SPECS, Spec(), _KV_SPEC, _KV_SPEC),
                    out_specs=Spec(), check_vma=False))


_COLLECTIVE = re.compile(
    r"=\s*(?P<dtype>[a-z]+\d*)\[(?P<shape>[\d,]*)\][^\s]*\s+"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?:-start)?\(")
_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


def collectives(hlo_text: str) -> list[dict]:
  """Collectives in compiled HLO text: kind and result bytes, in program order.

  For an all-reduce the result is its operand; for an all-gather it is the
  gathered array (the symbolic layer's S).
  """
  out = []
  for match in _COLLECTIVE.finditer(hlo_text):
    shape = [int(d) for d in match["shape"].split(",") if d]
    out.append({
        "kind": match["kind"], "dtype": match["dtype"],
        "bytes": int(np.prod(shape, dtype=np.int64)) * _BYTES[match["dtype"]]
    })
  return out
