"""What CPU tests' stand-in sessions share."""

import tenferro as tf


class RecordsFaults:
    """A session's `fault_seen`: records the fault and returns it naming one last launch, 'k'.

    The stand-in sets ``self.faults = []`` in its ``__init__``.
    """

    def fault_seen(self, exc):
        self.faults.append(exc)
        return tf.KernelFault(f"{exc}; last launches: ['k']", exc.result_name, exc.result_code,
                              ("k",))
