"""The per-chip network a prefill pool's K/V crosses to the decode pool."""

from __future__ import annotations

from jaxroof.specs.accelerators import Accelerator


def kv_link(device: Accelerator | None) -> tuple[float | None, str]:
  """(bytes/s per chip, what it is): the device's scale-out figure, its scale-up one when
  it records none, or None (the transfer assumed free) without a device or a network."""
  if device is None:
    return None, "raw numbers: no network figure, K/V transfer assumed free"
  net = device.links
  if net is None:
    return None, f"{device.name} records no network: K/V transfer assumed free"
  if net.scale_out_bytes_per_s is not None:
    return net.scale_out_bytes_per_s, (f"{device.name} scale-out "
                                       f"{net.scale_out_bytes_per_s / 1e9:g} GB/s per chip")
  return net.collective_bytes_per_s, (f"{device.name} scale-up {net.technology} "
                                      f"{net.collective_bytes_per_s / 1e9:g} GB/s per chip "
                                      "(no scale-out figure)")
