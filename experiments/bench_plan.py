"""Former name of `python -m experiments.bench --what=plan`: its command lines still run."""

from experiments import bench

if __name__ == "__main__":
  bench.run_as("plan")
