"""The files a study and its runs are written in and read back from: the study's plan
(``plan``), a run's folder (``runfolder``), the schema of each file format (``formats``), and
replay and compare of a run's manifest (``manifests``)."""
