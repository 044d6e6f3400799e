"""The README's quick example, as a module ``flowengine rehearse`` can name.

    flowengine rehearse readme_booking:flow          (from examples/)

Run: python examples/readme_booking.py
"""

from flowengine import engines, task
from flowengine.flows import linear_flow


class Reserve(task.Task):
    def execute(self, seat):
        return f"reserved {seat}"

    def revert(self, seat, result, **kwargs):
        print(f"releasing {seat}")   # runs if a later task fails


flow = linear_flow.Flow("booking").add(Reserve(provides="booking"))

if __name__ == "__main__":
    print(engines.run(flow, store={"seat": "12A"})["booking"])   # reserved 12A
