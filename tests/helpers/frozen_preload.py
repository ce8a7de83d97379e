"""Imported last by forked.py's server, after its preload.

The forked `python -m torch.distributed.run` agents name torch's rendezvous events as `gristmill
train`'s agent does (training.launch._cheap_event_names): torch's own naming, inspect.stack() twice an
event, walks sys.modules for each of the server's `<string>` frames, ~0.9 of the ~1.2 CPU s a forked
launch spent (6 launches of `-m platform` under the suite's per-test count, twice each).

Then the garbage collector's full passes stop walking what the server imported. Those objects (torch,
the trainer, pandas: ~400k) live as long as the server and every child forked from it, so
`gc.freeze()` moves them out of the collector's reach: a child's full collection then walks what the
child made (~0.2 s less each), and does not write to every preloaded object's header, which copied the
server's whole heap into each child page by page. xdist workers freeze theirs after collection
(tests/conftest.py)."""

import gc

from training.launch import _cheap_event_names

_cheap_event_names()
gc.collect()
gc.freeze()
