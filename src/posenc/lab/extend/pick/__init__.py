"""``posenc extend MODEL --pick --target T``: the run (``run.run_pick``: the plan, three studies in one folder,
``pick.md``, the save), its rules (``rules``: pure functions of settings and rows) and its rounds (``racing``:
screening and the race as ``run_extend`` round policies)."""
