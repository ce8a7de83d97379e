"""`gristmill mix propose`: a data mixture chosen from small proxy runs (docs/mixtures.md).

- recipe.py    the search's recipe (configs/mix/*.toml): sources, target, proxy, swarm, constraints,
               validation seeds, and its checks (one line each, in the recipe's keys)
- simplex.py   mixtures as points of the constrained simplex: the prior, the swarm, the projection
- fit.py       the regression of held-out loss on the mixture (cross-validated), its argmin, the gate
- proxies.py   each proxy a real `gristmill train` run; evidence keyed to the sources' fingerprints
- propose.py   the command: prior → swarm → proxies → fit → proposal → validation → gate → outputs
"""
