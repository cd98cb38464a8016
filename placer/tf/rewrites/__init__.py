"""The rewrites of an emitted graph, one file each, run in the order declared here.

Each module holds one :class:`~placer.tf.rewrites.base.Rewrite`
(``REWRITE``): a function ``run(graph_def, context) -> RewriteRecord`` over
the traced GraphDef and the frozen
:class:`~placer.tf.rewrites.base.RewriteContext` of the function being
emitted (:mod:`placer.tf.rewrites.base` states the contract).
:func:`placer.tf.emit.emit` runs :data:`REWRITES` in this order; the ones
marked *schedule* come last, and an export stores the graph before them
(:func:`placer.tf.export.load` applies them again for its devices):

===================  =========  =====================================================
rewrite              schedule   what it does (applies when)
===================  =========  =====================================================
bypass                          consumers of ``IdentityN`` read its inputs
split                           the plan's split ops as parts reading weight shards
gathers                         a sparse table's row gathers skip its copy (training)
devices                         every node gets its planned device
codecs                          cut float edges get the policy's codec
update-after-reads              variable writes wait for their readers (training)
order                yes        each device's ops in the plan's order (a planned order)
gates                yes        a replicated step's micro-batches ordered per device
copies               yes        a forward pass as micro-batch copies, gated (m > 1)
sends                yes        awaited cross-process transfers acknowledged
===================  =========  =====================================================

Adding a rewrite is one new file here with its ``REWRITE`` and one line in
:data:`REWRITES` (``tests/test_rewrites.py`` shows it with a toy rewrite).
"""

from __future__ import annotations

from . import bypass, compress, copies, devices, gates, gathers, order, sends, split, update_after_reads
from .base import Rewrite, RewriteContext, RewriteRecord, SendRule, find_record, run_rewrites, schedule_split

#: The rewrites :func:`placer.tf.emit.emit` runs, in order (schedule rewrites last: :func:`schedule_split`).
REWRITES: tuple[Rewrite, ...] = (
    bypass.REWRITE,
    split.REWRITE,
    gathers.REWRITE,
    devices.REWRITE,
    compress.REWRITE,
    update_after_reads.REWRITE,
    order.REWRITE,
    gates.REWRITE,
    copies.REWRITE,
    sends.REWRITE,
)

__all__ = ["REWRITES", "Rewrite", "RewriteContext", "RewriteRecord", "SendRule", "find_record", "run_rewrites",
           "schedule_split"]
