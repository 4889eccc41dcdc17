"""A run's lifecycle, from its checked inputs to its last checkpoint.

  train          the loop: restore first, then the whole RunState; each step and evaluation
  run_inputs     what a run reads and checks before it writes: model, task, memory plan
  run_state      the learner's state, its checkpoint tree and the workdir it is saved in
  checkpointing  orbax checkpoints: save, restore, damaged ones moved aside
  memory_plan    the passes of a step sized to the device's memory
  memory_estimates  what each pass holds: activations per remat policy, caches, weights
  evaluation     avg@k, best@k and worst@k on held-out problems
  resume_check   a resumed run's settings against those it was started with
  workdir_lock   one live run per workdir, across hosts
  preemption     SIGTERM to a saved step boundary
"""
