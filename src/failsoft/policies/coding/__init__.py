"""ParM's erasure code for prediction serving (pure, numpy only): encoders, decoders, coding groups.

* :mod:`~failsoft.policies.coding.interface`: the contract (``Encoder``, ``Decoder``), the code
  matrix ``G`` and the bounds of k and r;
* :mod:`~failsoft.policies.coding.encoders`: ``add`` (sections 3-4) and ``concat`` (5.2.3);
* :mod:`~failsoft.policies.coding.decoders`: ``sub`` (r = 1) and ``linear`` (any r, section 7);
* :mod:`~failsoft.policies.coding.groups`: the coding-group former (arrival order, fill timeout)
  and the per-group answer tracker (first k of k+r, stragglers to cancel).

Look encoders and decoders up by name in :mod:`failsoft.policies.registry` (``coding`` seam).
"""
