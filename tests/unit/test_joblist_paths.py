"""A job list cannot make a job write outside its own folder OUT/jobs/NAME (issue 18,
cause 2: a job whose config held ``resume: <another run>`` rewrote that run)."""

import pytest

from phalanx.cluster.live.joblist import load_job_list
from phalanx.errors import DataError


@pytest.mark.parametrize("setting", ["resume: /tmp/other-run", "out: /tmp/x",
                                     "overwrite: true"])
def test_a_job_cannot_name_a_folder_to_write_in(tmp_path, setting):
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - name: a\n    arrival: 0\n    gpus: 1\n"
                    f"    config: {{model: mlp, {setting}}}\n")
    with pytest.raises(DataError, match="config\\.(resume|out|overwrite): do not set it"):
        load_job_list(path)


def test_csv_job_list_cannot_resume_either(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("name,arrival,gpus,resume\na,0,1,/tmp/other-run\n")
    with pytest.raises(DataError, match="config.resume: do not set it"):
        load_job_list(path)
