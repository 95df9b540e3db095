"""Calibration: every fit of the cost model's terms to measured times.

Operations (`op_fit`), the toy decode step (`toy_fit`, `toy_job`; two runs compared:
`repeatability`), users' step tables (`row_fit`, `user_fit`), parallel layouts
(`layout_fit`) and real engines' serving runs (`engine_replay`, `engine_search`,
`engine_fit`), on one optax core (`fitting`). Terms are named by the cost-term
registry (`jaxroof.symbolic.terms`). Above serving and parallel because the last two
replay layouts and the simulator; `measure/` only times and reads measurements.
"""
