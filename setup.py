"""Package discovery, the one thing pyproject.toml cannot say: folder ≠ import name.

The design card names the service's folders `service/` and `worker/`; installed, they would be the
packages `service` and `worker`, names far too likely to collide in site-packages. So each app folder
is mapped to a prefixed import name (`core/` → `autofusion_core`, `service/` → `autofusion_service`,
`worker/` → `autofusion_worker`), and the engine keeps its folder-equals-name layout. Subpackages are
found, not listed, so a new subpackage needs no change here.
"""

from setuptools import find_packages, setup

MAPPED = {"autofusion_core": "core", "autofusion_service": "service", "autofusion_worker": "worker"}


def packages() -> tuple[list[str], dict[str, str]]:
    found = find_packages(include=["graph_autofusion", "graph_autofusion.*"])
    package_dir: dict[str, str] = {}
    for name, folder in MAPPED.items():
        package_dir[name] = folder
        subpackages = find_packages(folder)
        found += [name, *(f"{name}.{sub}" for sub in subpackages)]
    return found, package_dir


PACKAGES, PACKAGE_DIR = packages()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR)
