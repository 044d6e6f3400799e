"""The kombu edge: the only package in flowengine that imports kombu.

Connections and per-broker tuning (:mod:`.connection`), publishing, consuming and settling
(:mod:`.proxy`, :mod:`.producers`), routing and decoding what arrives (:mod:`.dispatcher`), the
broadcast events use (:mod:`.broadcast`) and flowengine's own kombu transports
(``flowengine-fs``, ``beanstalk``, and the lean Redis and memory channels). Everything above this
package sees :class:`~flowengine.worker_based.broker.delivery.Delivery` values, never a kombu
message.
"""
