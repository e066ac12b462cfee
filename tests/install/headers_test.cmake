# cmake -P headers_test.cmake with BUILD_DIR, WORK_DIR, GENERATOR, CXX, LAUNCHER: installs this
# build into a temporary prefix, then compiles, for every header installed under
# include/cocodiff/, a translation unit holding only `#include <cocodiff/that/header.hpp>`,
# against the installed package (find_package(cocodiff), cocodiff::api's include paths and
# flags, as a user has them). Fails naming each header that does not compile on its own.
cmake_policy(VERSION 3.25)

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

file(GLOB_RECURSE headers RELATIVE ${prefix}/include ${prefix}/include/cocodiff/*.hpp)
list(LENGTH headers count)
if(count EQUAL 0)
  message(FATAL_ERROR "no headers installed under ${prefix}/include/cocodiff")
endif()
foreach(h cocodiff/cocodiff.hpp cocodiff/run.hpp cocodiff/extend.hpp)
  if(NOT h IN_LIST headers)
    message(FATAL_ERROR "the facade header ${h} is not installed")
  endif()
endforeach()

# One source per header, in a project of its own built against the prefix.
set(project ${WORK_DIR}/project)
set(sources)
foreach(h ${headers})
  string(MAKE_C_IDENTIFIER ${h} name)
  file(WRITE ${project}/${name}.cpp "#include <${h}>\n")
  list(APPEND sources ${name}.cpp)
endforeach()
list(JOIN sources " " sources)
file(WRITE ${project}/CMakeLists.txt "cmake_minimum_required(VERSION 3.25)
project(cocodiff_headers LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(cocodiff 0.1 REQUIRED)
add_library(headers OBJECT ${sources})
target_compile_options(headers PRIVATE -Wall -Wextra -Werror)
target_link_libraries(headers PRIVATE cocodiff::api)
")
set(launcher)
if(LAUNCHER)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
check_run("configure the header project"
  COMMAND ${CMAKE_COMMAND} -S ${project} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} ${launcher}
    -DCMAKE_PREFIX_PATH=${prefix})
set(keep_going)
if(GENERATOR MATCHES "Ninja")
  set(keep_going -- -k 0)  # every header that fails, not only the first
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build ${keep_going}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  set(failed)
  foreach(h ${headers})
    string(MAKE_C_IDENTIFIER ${h} name)
    if(out MATCHES "FAILED: [^\n]*${name}\\.cpp")
      list(APPEND failed ${h})
    endif()
  endforeach()
  list(JOIN failed "\n  " failed)
  message(FATAL_ERROR "installed headers that do not compile on their own:\n  ${failed}\n\n"
                      "${out}\n${err}")
endif()
message(STATUS "${count} installed headers, each compiles on its own")
file(REMOVE_RECURSE ${WORK_DIR})
