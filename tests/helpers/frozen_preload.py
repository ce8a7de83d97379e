"""Imported last by forked.py's server, after its preload: the garbage collector's full passes stop
walking what the server imported. Those objects (torch, the trainer, pandas: ~400k) live as long as
the server and every child forked from it, so `gc.freeze()` moves them out of the collector's
reach: a child's full collection then walks what the child made (~0.2 s less each), and does not
write to every preloaded object's header, which copied the server's whole heap into each child
page by page. xdist workers freeze theirs after collection (tests/conftest.py)."""

import gc

gc.collect()
gc.freeze()
