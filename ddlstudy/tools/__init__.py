"""Tools around the study: ``doctor`` (what this machine offers), ``bench`` (the
benchmarks: performance figures as ratios, a module a subcommand), ``predict`` (an
alpha-beta model of many nodes), ``pipeline_model`` (a pipeline's step predicted from its
measured costs) and ``advise`` (how to train a use case here)."""
