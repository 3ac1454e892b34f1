"""_version.py: the one place Djinn's version is written - the Python package reads
it, and CMakeLists.txt reads it for the C side (project VERSION, djinnd --version)."""
__version__ = "0.1.0"
