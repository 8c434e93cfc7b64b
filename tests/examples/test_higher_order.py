"""examples/higher_order.py reaches what its docstring says."""
import runpy

from tests.examples.helpers import ROOT


def test_higher_order_example(capsys):
    runpy.run_path(str(ROOT / "examples" / "higher_order.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()

    def value(prefix, after):
        line = next(line for line in lines if line.startswith(prefix))
        return float(line.split(after)[1].split(",")[0].split()[0].rstrip(")"))

    assert abs(value("newton 1-d", "f'(x*) = ")) < 1e-12
    assert abs(value("newton 1-d", "x* = ") - 1.1309011226) < 1e-9
    rosenbrock = next(line for line in lines if line.startswith("newton rosenbrock"))
    assert "p* = (1.0000000000, 1.0000000000)" in rosenbrock
    assert value("hessian-vector product", "finite differences ") < 1e-6
    plain_accuracy = value("gradient penalty 0.0", "test accuracy ")
    plain_slope = value("gradient penalty 0.0", "|dscore/dx| ")
    penalised_accuracy = value("gradient penalty 0.1", "test accuracy ")
    penalised_slope = value("gradient penalty 0.1", "|dscore/dx| ")
    assert plain_accuracy >= 0.95 and penalised_accuracy >= 0.95
    assert penalised_slope < plain_slope / 5      # the penalty flattens the score
