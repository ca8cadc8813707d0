"""Train with tuneup: ``python run.py [group=option ...] [key=value ...]`` (see conf/config.yaml)."""

import hydra

import trainer.runner


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    return trainer.runner.main(cfg)


if __name__ == "__main__":
    main()
