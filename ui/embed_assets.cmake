# Turns the built page (ui/dist, committed) into ui_assets.cpp: one byte array per file and the
# table sy::server::ui_assets() returns, so that `serve --ui` needs no files at run time.
# Usage: cmake -DDIST=<ui/dist> -DOUT=<file.cpp> -P embed_assets.cmake
file(GLOB_RECURSE files RELATIVE ${DIST} ${DIST}/*)
list(SORT files)
set(arrays "")
set(table "")
set(index 0)
foreach(name ${files})
  file(READ ${DIST}/${name} hex HEX)
  file(SIZE ${DIST}/${name} size)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  # A trailing 0 keeps an empty file's array legal; the size says where the file ends.
  string(APPEND arrays "const unsigned char kFile${index}[] = {${bytes}0};\n")
  string(APPEND table "    {\"${name}\", kFile${index}, ${size}},\n")
  math(EXPR index "${index} + 1")
endforeach()
if(index EQUAL 0)
  message(FATAL_ERROR "ui/dist is empty: build the page (cd ui && npm install && npm run build)")
endif()
file(WRITE ${OUT} "// Generated from ui/dist by ui/embed_assets.cmake: do not edit.
#include \"server/ui.h\"

namespace sy::server {
namespace {
${arrays}
const UiAsset kAssets[] = {
${table}};
}  // namespace

std::span<const UiAsset> ui_assets() {
  return kAssets;
}

}  // namespace sy::server
")
