"""Calibration: every fit of the cost model's factors to measured times.

Operations (`op_fit`), the toy decode step (`toy_job`), users' step tables
(`user_fit`), parallel layouts (`layout_fit`) and real engines' serving runs
(`engine_fit`), on one optax core (`fitting`). Above serving and parallel
because the last two replay layouts and the simulator; `measure/` only times
and reads measurements.
"""
