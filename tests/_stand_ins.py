"""What CPU tests' stand-ins for a session's state share."""

import tenferro as tf


class RecordsFaults:
    """A session state's `record_fault`: records the fault, returns it naming one last launch 'k'.

    The stand-in sets ``self.faults = []`` in its ``__init__``.
    """

    def record_fault(self, exc):
        self.faults.append(exc)
        return tf.KernelFault(f"{exc}; last launches: ['k']", exc.result_name, exc.result_code,
                              ("k",))
