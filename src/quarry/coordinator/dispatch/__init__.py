"""The one host dispatch (DESIGN §3, one pipeline): every kind of work (SQL fragments, gene
statistics, samples, offloaded lines) goes out as tasks and comes back as merged streams
(``streams``); pushed-back ranges are completed on the host with the same unit of work; a device
that stops answering is replaced by a replica for the rest, counted once (``failover``); what
each device did is a ``report.WorkReport``."""
