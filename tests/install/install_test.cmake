# cmake -P install_test.cmake with BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR, CXX, LAUNCHER.
function(check_run what)
  execute_process(${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
check_run("cmake --install" COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

foreach(f bin/cocodiff include/cocodiff/cocodiff.hpp include/cocodiff/dit/attention_strategy.hpp
          share/cocodiff/configs/models/flux1-tiny.toml share/cocodiff/configs/clusters/aurora.toml)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()
file(GLOB_RECURSE package_files ${prefix}/*/cocodiffConfig.cmake)
if(NOT package_files)
  message(FATAL_ERROR "no cocodiffConfig.cmake under ${prefix}")
endif()

# The installed program finds the configs installed beside it, from any directory.
set(ENV{COCODIFF_CONFIG_DIR} "")
check_run("cocodiff --version" COMMAND ${prefix}/bin/cocodiff --version WORKING_DIRECTORY ${WORK_DIR})
string(FIND "${LAST_OUTPUT}" "configs: ${prefix}/share/cocodiff/configs" at)
if(at EQUAL -1)
  message(FATAL_ERROR "cocodiff --version does not name the installed configs:\n${LAST_OUTPUT}")
endif()
check_run("installed cocodiff validate"
  COMMAND ${prefix}/bin/cocodiff validate ${prefix}/share/cocodiff/configs/mpi-smoke.toml
  WORKING_DIRECTORY ${WORK_DIR})

# A project of one's own: find_package(cocodiff), a strategy registered by name, a run built
# in code through the facade and the same run from its config file.
set(launcher)
if(LAUNCHER)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
check_run("configure examples/consumer"
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${WORK_DIR}/consumer
    -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} ${launcher}
    -DCMAKE_PREFIX_PATH=${prefix})
check_run("build examples/consumer" COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
check_run("run examples/consumer"
  COMMAND ${WORK_DIR}/consumer/consumer ${SOURCE_DIR}/examples/consumer/consumer.toml
  WORKING_DIRECTORY ${WORK_DIR})
message(STATUS "${LAST_OUTPUT}")
foreach(line "in code: strategy kv_gather on 4 ranks: virtual time "
             "reference: strategy flat on 4 ranks: virtual time "
             "strategy kv_gather on 4 ranks: virtual time "
             "consumer.toml: the same run as the run in code")
  string(FIND "${LAST_OUTPUT}" "${line}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the consumer's output lacks \"${line}\":\n${LAST_OUTPUT}")
  endif()
endforeach()
# The typed run's result: bytes on the tiers of the cut-down node, the 64-digit hashes, the
# latent's shape.
foreach(pattern "die-to-die +[1-9][0-9]* bytes" "intra-node +[1-9][0-9]* bytes"
                "output   [0-9a-f]+\n" "timeline [0-9a-f]+\n" "latent   \\[[0-9]+, 1 x [0-9]+ x [0-9]+\\]")
  if(NOT LAST_OUTPUT MATCHES "${pattern}")
    message(FATAL_ERROR "the consumer's typed result does not match '${pattern}':\n${LAST_OUTPUT}")
  endif()
endforeach()
# The same run in code over MPI (cocodiff::run_mpi, every rank of the job alike): the
# emulator's output bytes.
if(MPIEXEC)
  check_run("run examples/consumer over MPI"
    COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np 4
            ${WORK_DIR}/consumer/consumer --mpi ${WORK_DIR}/mpi-out
    WORKING_DIRECTORY ${WORK_DIR})
  message(STATUS "${LAST_OUTPUT}")
  string(FIND "${LAST_OUTPUT}" "over MPI: the same as the emulator's output bytes" at)
  if(at EQUAL -1 OR NOT EXISTS ${WORK_DIR}/mpi-out/report.json)
    message(FATAL_ERROR "the consumer's MPI run does not give the emulator's bytes:\n${LAST_OUTPUT}")
  endif()
endif()
file(REMOVE_RECURSE ${WORK_DIR})
