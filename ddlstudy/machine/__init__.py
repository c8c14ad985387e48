"""What the machine is and does during a run: its description in the manifest
(``environment``), the resource samples taken beside a run (``sampler``) and the Spark
driver's JVM (``sparkjvm``)."""
