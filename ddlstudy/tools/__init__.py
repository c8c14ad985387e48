"""Tools around the study: ``doctor`` (what this machine offers), ``bench`` and
``bench_all`` (performance figures as ratios), ``bench_reduce`` (the reducers under
mpiexec), ``predict`` (an alpha-beta model of many nodes)."""
