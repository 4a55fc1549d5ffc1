"""Tests of the tally Python package, on tally's host backend (simulated
devices), with or without PyTorch installed.

tally reads TALLY_CONF once, at its first use, so the configuration is set
here, before any test module touches the library. Tests that need another
configuration run Python in a subprocess (see support.run_python)."""

import os

CONF = "backend:host,host_devices:2,host_capacity:1GiB,leak_report:off,stage_report:false,timeline:true"
os.environ["TALLY_CONF"] = CONF
