"""The budget planner and the scaling-law analysis: pure functions of numbers.

Nothing here touches a JAX device (NumPy, SciPy and matplotlib only), so every
function runs in a notebook without an accelerator. Modules, in workflow order:

  grids        allocation grids (B_p, n, M) under a budget C and B_max; compute units
  records      run directories -> per-allocation curves; record-breaking points
  sigmoid_fit  the ScaleRL sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
  frontier     the upper envelope over fitted curves, n*(C) and its sigmoid law
  analysis     the whole sweep analysis behind `launch.analyze` / analysis.json
  prescribe    (n, B_p, M, LR) for a budget from a fitted or paper-default law
  plots        the PNG figures of an analysis
  synthetic    sweeps with known curves (tests, launch.bench_analyze, launch.demo_analysis)
"""
