"""warren.spark.daemon's path change (no Spark needed): Spark's pyspark.zip and py4j zip go
behind an installed pyspark of the same version, and stay first otherwise."""

from __future__ import annotations

import zipfile

from warren.spark.daemon import prefer_installed_pyspark


def _spark_home(tmp_path, version: str) -> tuple[str, str]:
    lib = tmp_path / "spark" / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as z:
        z.writestr("pyspark/__init__.py", "")
        z.writestr("pyspark/version.py", f'__version__: str = "{version}"\n')
    with zipfile.ZipFile(lib / "py4j-0.10.9.9-src.zip", "w") as z:
        z.writestr("py4j/__init__.py", "")
    return str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def _site(tmp_path, version: str | None, py4j: bool = True) -> str:
    site = tmp_path / "site"
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    if version is not None:
        (site / "pyspark" / "version.py").write_text(f"__version__: str = '{version}'\n")
    if py4j:
        (site / "py4j").mkdir()
        (site / "py4j" / "__init__.py").write_text("")
    return str(site)


def test_zips_go_last_when_the_installed_pyspark_is_the_same(tmp_path):
    zip_, py4j = _spark_home(tmp_path, "4.2.0")
    site = _site(tmp_path, "4.2.0")
    assert prefer_installed_pyspark(["", zip_, py4j, "/x", site]) == ["", "/x", site, zip_, py4j]


def test_nothing_changes_for_another_version_or_without_an_installed_pyspark(tmp_path):
    zip_, py4j = _spark_home(tmp_path, "4.2.0")
    path = [zip_, py4j, _site(tmp_path, "4.1.1")]
    assert prefer_installed_pyspark(path) == path
    assert prefer_installed_pyspark([zip_, py4j, str(tmp_path / "empty")]) == [zip_, py4j, str(tmp_path / "empty")]


def test_nothing_changes_without_py4j_installed_or_without_the_zip(tmp_path):
    zip_, py4j = _spark_home(tmp_path, "4.2.0")
    site = _site(tmp_path, "4.2.0", py4j=False)
    assert prefer_installed_pyspark([zip_, py4j, site]) == [zip_, py4j, site]
    assert prefer_installed_pyspark(["/a", site]) == ["/a", site]
