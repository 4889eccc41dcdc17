"""Sweeps: many `isojax.main` runs of one experiment, planned, run and analysed.

  plan       a sweep config -> run configs (the planner's grid), the manifest
             (DIR/sweep.json), the analysis of the finished runs
  runner     the local backend: a pool of `isojax.main` subprocesses that skips
             finished runs and resumes interrupted ones
  cluster    the SLURM array and TPU-VM scripts of the other backends
  profiling  the base model's pass rates per problem and the paper's difficulty splits

`launch.sweep`, `launch.profile` and `launch.study` are the command lines.
"""
