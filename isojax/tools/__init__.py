"""Tools that read finished runs: how fast one reaches a baseline's target
(`time_to_target`, `launch.compare`), and whether two computed the same numbers bit for
bit (`run_compare`, and `identical_runs`, `launch.check_identical`'s runs at a base
commit and at this checkout)."""
