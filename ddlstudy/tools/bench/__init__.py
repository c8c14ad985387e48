"""The benchmarks of ``ddlstudy bench``: performance figures as ratios of two settings
measured side by side, alternated, each min / median / max over its repeats.

Its modules, one a subcommand (nothing is imported here, so that ``python -m
ddlstudy.tools.bench.reduce`` under mpiexec loads its own module alone): ``ratios``
(overhead, sampler and reduce, and what every figure is made of: ``What``, ``Ratio``),
``suite`` (``bench all``, every figure in one command), ``start`` (``bench all --only
start``: plain runs' starts and strategies at their bound), ``collectives`` (``bench
collectives``: this host's shared memory against gloo), ``reduce`` (the reducers under
mpiexec, launched by ``bench reduce``) and ``advise`` (``bench advise``: how right advise
is).
"""
