# cmake/strata_python.cmake: the Python package's build (pip install ., pip install -e .,
# python -m build --wheel; pyproject.toml drives it through scikit-build-core, which sets SKBUILD and
# Python_EXECUTABLE). Included from the top-level CMakeLists.txt before find_package(Torch).
#
# LibTorch is the torch installed beside the Python that runs the build: the library must load into
# the torch that will import it, so the build needs pip's --no-build-isolation (an isolated build
# environment has no torch, and must not download another one).
find_package(Python COMPONENTS Interpreter REQUIRED)
# `del sys.path[0]`: -c puts the working folder first, and the source tree's torch/ (C++) would be
# imported as a namespace package wherever no real torch is installed.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
          "import sys; del sys.path[0]; import torch; print(torch.utils.cmake_prefix_path + ';' + torch.__version__, end='')"
  OUTPUT_VARIABLE STRATA_PY_TORCH ERROR_VARIABLE STRATA_PY_TORCH_ERROR RESULT_VARIABLE STRATA_PY_TORCH_RC)
if(NOT STRATA_PY_TORCH_RC EQUAL 0)
  message(FATAL_ERROR
    "strata: the Python that builds the package (${Python_EXECUTABLE}) cannot import torch. Install "
    "torch in that environment first, then build without isolation so that the build uses it:\n"
    "  pip install --no-build-isolation .      (or: python -m build --wheel --no-isolation)\n"
    "${STRATA_PY_TORCH_ERROR}")
endif()
list(GET STRATA_PY_TORCH 0 STRATA_TORCH_PREFIX)
list(GET STRATA_PY_TORCH 1 STRATA_TORCH_VERSION)
message(STATUS "strata: building against torch ${STRATA_TORCH_VERSION} (${STRATA_TORCH_PREFIX})")
list(APPEND CMAKE_PREFIX_PATH "${STRATA_TORCH_PREFIX}")

# Installs `target` (a shared library) into the package: site-packages/strata/, where
# python/strata/__init__.py looks for it. Its RUNPATH names torch's libraries beside it
# (site-packages/torch/lib); `import strata` has imported torch, so they are loaded anyway.
# $ORIGIN: libstrata_encoder.so needs libstrata_torch.so, which lies beside it.
function(strata_install_into_package target)
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN;$ORIGIN/../torch/lib")
  install(TARGETS ${target} LIBRARY DESTINATION strata)
endfunction()
