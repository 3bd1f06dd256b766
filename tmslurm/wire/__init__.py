"""The typed contract between tmslurm's processes: messages (validated models), line framing and
channels (protocol), and the node relay's multiplexed frames (mux).

Contract: code here runs in every process and imports neither :mod:`tmslurm.agent` nor
:mod:`tmslurm.controller`. Bad input is refused with :class:`tmslurm.core.errors.ProtocolError` (or a
``bad_message`` reply), never by crashing the reader.
"""
