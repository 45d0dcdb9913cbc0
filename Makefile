# Makefile for clientpool (GNU make).
#
# Variable names are the ones LuaRocks passes to a make build (LUA,
# LUA_VERSION, LUA_INCDIR, LUA_LIBDIR, LUA_SHAREDIR, PREFIX, CFLAGS, LIBFLAG,
# DESTDIR).  The module is never linked with -llua: the interpreter that
# loads it provides the Lua API symbols.
#
#   make                 build clientpool/core.so for every interpreter
#                        (build/<interp>/clientpool/core.so)
#   make module          one build for LUA_INCDIR (build/module/...), used by install
#   make test            deps, build, C tests (gcc and clang ASan/UBSan),
#                        busted under lua5.1/5.2/5.3/5.4/luajit, the LuaRocks build
#                        and its specs, luacheck, then one summary line
#   make check-memory    C tests under ASan/UBSan, and the lua5.4 busted suite
#                        against an ASan/UBSan build of the module
#   make fuzz            the engine against its reference model under libFuzzer
#                        for FUZZ_TIME seconds (default 60); `make test` runs
#                        fuzz-ci (FUZZ_CI_RUNS seeded runs, default 8000); fuzz-merge adds
#                        new inputs to the seed corpus
#   make coverage        branch coverage of csrc/engine.c from the C tests and
#                        the lua5.4 specs (gcc --coverage, build/cov)
#   make stress          the driver's model-checked random workload, longer
#                        (STRESS_SEEDS, default 5000, on every interpreter)
#   make demo            the nginx gateway demo (clientpool against bare
#                        lua-resty-redis under wrk; a table and an SVG)
#   make demo-lua | bench | bench-nginx | bench-http | lint | install | clean | cdef
#
# Single steps of `make test`: all test-c test-c-asan test-fleet test-fleet-asan
# test-fleet-valgrind fuzz-ci test-busted-<interp>
# test-busted-luajit-ffi test-busted-asan test-valgrind-<interp> test-nginx test-fleet-redis
# test-nginx-redisfleet test-prometheus check-rockspec test-rocks soak-valgrind lint.
#
# check-memory preloads clang-14's ASan runtime (libclang_rt.asan-<arch>.so)
# into the uninstrumented lua5.4 so an ASan/UBSan build of core.so can be
# loaded; LeakSanitizer runs at exit (suppressions: scripts/lsan.supp if
# present).  valgrind is installed but not needed for this.

LUA_VERSION ?= 5.4
LUA         ?= lua$(LUA_VERSION)
PREFIX      ?= /usr/local
LUA_INCDIR  ?= /usr/include/lua$(LUA_VERSION)
# Accepted for LuaRocks compatibility; unused since -llua is never linked.
LUA_LIBDIR  ?= $(PREFIX)/lib
# Install destinations of the Lua modules and of the C module.
LUA_SHAREDIR ?= $(PREFIX)/share/lua/$(LUA_VERSION)
LUA_CMODDIR  ?= $(PREFIX)/lib/lua/$(LUA_VERSION)
DESTDIR     ?=

CFLAGS      ?= -O2
LIBFLAG     ?= -shared
CLANG       ?= clang-14
BUSTED      ?= /usr/bin/busted
LUACHECK    ?= luacheck
LUAROCKS    ?= luarocks

WARNFLAGS := -std=c11 -Wall -Wextra -Werror -pedantic -Wshadow \
             -Wmissing-prototypes -Wstrict-prototypes
SANFLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=all \
             -fno-omit-frame-pointer -g -O1
# Flags every compile gets, whatever CFLAGS the caller passes.
BASEFLAGS  = $(WARNFLAGS) -fPIC -fno-semantic-interposition -Icsrc
LIBS      := -lm

CORE_SRCS   := csrc/engine.c csrc/clock.c csrc/lclientpool.c csrc/lfastpath.c csrc/fleet.c csrc/lfleet.c
ENGINE_SRCS := csrc/engine.c csrc/clock.c csrc/fleet.c
CTEST_SRC   := spec/c/test_engine.c $(sort $(wildcard spec/c/test_engine_*.c))
# The C tests link the engine through spec/c/whitebox.c: csrc/engine.c as
# is, plus allocation-failure injection and internal views for the tests.
CTEST_LINK  := spec/c/whitebox.c csrc/clock.c csrc/fleet.c

INTERPS := lua5.1 lua5.2 lua5.3 lua5.4 luajit
INCDIR_lua5.1 := /usr/include/lua5.1
INCDIR_lua5.2 := /usr/include/lua5.2
INCDIR_lua5.3 := /usr/include/lua5.3
INCDIR_lua5.4 := /usr/include/lua5.4
INCDIR_luajit := /usr/include/luajit-2.1

# Lua search paths for the source tree.
LPATH := ./lua/?.lua;./lua/?/init.lua
# Spec roots given to busted; spec files are *_spec.lua under them.
SPEC_ROOTS := spec

# The ASan runtime to preload into an uninstrumented interpreter.
ASAN_RT = $(shell $(CLANG) -print-file-name=libclang_rt.asan-$(shell uname -m).so 2>/dev/null)
ASAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1 \
           $(if $(wildcard scripts/lsan.supp),LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp:print_suppressions=0) \
           UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# env prefix that makes an interpreter find lua/ and a build dir ($(1)).
lua_env = env LUA_PATH='$(LPATH);;' LUA_PATH_5_2='$(LPATH);;' LUA_PATH_5_3='$(LPATH);;' LUA_PATH_5_4='$(LPATH);;' \
              LUA_CPATH='./$(1)/?.so;;' LUA_CPATH_5_2='./$(1)/?.so;;' LUA_CPATH_5_3='./$(1)/?.so;;' \
              LUA_CPATH_5_4='./$(1)/?.so;;'

LINT_DIRS = $(wildcard lua spec examples bench)

.PHONY: all module test test-nginx-fleet test-fleet-redis test-nginx-redisfleet deps check-memory demo demo-lua bench lint install clean cdef \
        test-c test-c-asan test-fleet test-fleet-asan test-fleet-valgrind \
        test-busted-asan test-rocks check-rockspec $(addprefix test-busted-,$(INTERPS)) \
        test-busted-luajit-ffi test-nginx test-prometheus bench-nginx bench-http

all: $(foreach i,$(INTERPS),build/$(i)/clientpool/core.so)

# ---------------------------------------------------------------- builds

# One object dir and one core.so per interpreter.
define interp_rules
build/obj/$(1)/%.o: csrc/%.c
	@mkdir -p $$(@D)
	$$(CC) $$(BASEFLAGS) $$(CFLAGS) $$(CPPFLAGS) -I$$(INCDIR_$(1)) -MMD -MP -c $$< -o $$@

build/$(1)/clientpool/core.so: $$(patsubst csrc/%.c,build/obj/$(1)/%.o,$$(CORE_SRCS))
	@mkdir -p $$(@D)
	$$(CC) $$(LIBFLAG) -Wl,-Bsymbolic-functions $$(LDFLAGS) -o $$@ $$^ $$(LIBS)
endef
$(foreach i,$(INTERPS),$(eval $(call interp_rules,$(i))))

# `make module LUA_INCDIR=...`: one build for the given headers.  The flags
# are recorded so that a different LUA_INCDIR or CFLAGS rebuilds.
MODULE_FLAGS := $(CC) $(BASEFLAGS) $(CFLAGS) $(CPPFLAGS) -I$(LUA_INCDIR) | $(LIBFLAG) $(LDFLAGS)
ifneq ($(filter module install,$(MAKECMDGOALS)),)
ifneq ($(MODULE_FLAGS),$(shell cat build/obj/module/.flags 2>/dev/null))
$(shell mkdir -p build/obj/module && printf '%s' '$(MODULE_FLAGS)' > build/obj/module/.flags)
endif
endif

module: build/module/clientpool/core.so

build/obj/module/%.o: csrc/%.c build/obj/module/.flags
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(CFLAGS) $(CPPFLAGS) -I$(LUA_INCDIR) -MMD -MP -c $< -o $@

build/module/clientpool/core.so: $(patsubst csrc/%.c,build/obj/module/%.o,$(CORE_SRCS))
	@mkdir -p $(@D)
	$(CC) $(LIBFLAG) $(LDFLAGS) -o $@ $^ $(LIBS)

# The module under ASan/UBSan for lua5.4 (check-memory).
build/obj/asan-lua5.4/%.o: csrc/%.c
	@mkdir -p $(@D)
	$(CLANG) $(BASEFLAGS) $(SANFLAGS) -I$(INCDIR_lua5.4) -MMD -MP -c $< -o $@

build/asan-lua5.4/clientpool/core.so: $(patsubst csrc/%.c,build/obj/asan-lua5.4/%.o,$(CORE_SRCS))
	@mkdir -p $(@D)
	$(CLANG) $(SANFLAGS) -shared -o $@ $^ $(LIBS)

# C engine tests: no Lua at all.
build/ctest/test_engine: $(CTEST_SRC) $(CTEST_LINK) $(ENGINE_SRCS) $(wildcard csrc/*.h spec/c/*.h)
	@mkdir -p $(@D)
	$(CC) $(WARNFLAGS) -O2 -g -Icsrc -o $@ $(CTEST_SRC) $(CTEST_LINK) $(LIBS)

build/ctest/test_engine-asan: $(CTEST_SRC) $(CTEST_LINK) $(ENGINE_SRCS) $(wildcard csrc/*.h spec/c/*.h)
	@mkdir -p $(@D)
	$(CLANG) $(WARNFLAGS) $(SANFLAGS) -Icsrc -o $@ $(CTEST_SRC) $(CTEST_LINK) $(LIBS)

# C fleet tests: forked processes on one shared segment; the test includes
# csrc/fleet.c (its internals: the reclaim hook, the raw layout).
FLEET_TEST_SRC := spec/c/test_fleet.c
build/ctest/test_fleet: $(FLEET_TEST_SRC) csrc/fleet.c csrc/fleet.h
	@mkdir -p $(@D)
	$(CC) $(WARNFLAGS) -O2 -g -Icsrc -o $@ $(FLEET_TEST_SRC) $(LIBS)

build/ctest/test_fleet-asan: $(FLEET_TEST_SRC) csrc/fleet.c csrc/fleet.h
	@mkdir -p $(@D)
	$(CLANG) $(WARNFLAGS) $(SANFLAGS) -Icsrc -o $@ $(FLEET_TEST_SRC) $(LIBS)

-include $(wildcard build/obj/*/*.d)

# ---------------------------------------------------------------- tests

deps:
	@scripts/deps.sh

TEST_STEPS := all test-c test-c-asan test-fleet test-fleet-asan test-fleet-valgrind fuzz-ci \
              $(addprefix test-busted-,$(INTERPS)) test-busted-luajit-ffi \
              test-busted-asan test-valgrind-lua5.3 test-valgrind-lua5.2 test-valgrind-lua5.1 test-nginx test-nginx-fleet test-fleet-redis test-nginx-redisfleet test-prometheus check-rockspec \
              test-rocks soak-valgrind lint

# Every step runs even after one fails; scripts/run-steps.sh prints one
# line per step and an overall line, and fails if any step failed.
test: deps
	@MAKE='$(MAKE)' scripts/run-steps.sh $(TEST_STEPS)

test-c: build/ctest/test_engine
	build/ctest/test_engine

test-c-asan: build/ctest/test_engine-asan
	$(ASAN_ENV) build/ctest/test_engine-asan

# The fleet's C tests (about 20 s), under ASan/UBSan, and under valgrind
# memcheck (children follow the fork; a smaller hammer: FLEET_TEST_SCALE).
test-fleet: build/ctest/test_fleet
	build/ctest/test_fleet

test-fleet-asan: build/ctest/test_fleet-asan
	$(ASAN_ENV) FLEET_TEST_SCALE=50 build/ctest/test_fleet-asan

test-fleet-valgrind: build/ctest/test_fleet
	FLEET_TEST_SCALE=5 valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
	  build/ctest/test_fleet

# On LuaJIT the suite runs twice: test-busted-luajit with the C API backend
# (clientpool.core), test-busted-luajit-ffi with the FFI one (clientpool.ffi).
define busted_rule
test-busted-$(1): build/$(1)/clientpool/core.so
	@CLIENTPOOL_BACKEND=core scripts/busted-run.sh $(1) '--lpath=$$(LPATH)' '--cpath=./build/$(1)/?.so' $$(SPEC_ROOTS)
endef
$(foreach i,$(INTERPS),$(eval $(call busted_rule,$(i))))

test-busted-luajit-ffi: build/luajit/clientpool/core.so
	@CLIENTPOOL_BACKEND=ffi scripts/busted-run.sh luajit '--lpath=$(LPATH)' '--cpath=./build/luajit/?.so' $(SPEC_ROOTS)

# The OpenResty specs in a private nginx (Debian's, with the Lua module) and a
# private redis-server, both on 127.0.0.1 and always stopped: spec/nginx/run.sh.
test-nginx: build/luajit/clientpool/core.so
	@spec/nginx/run.sh

# The fleet in real nginx (4 workers, one fleet, redis sampled under wrk,
# kill -9 and HUP under load): spec/nginx/fleet/run.sh, about 30 s.
test-nginx-fleet: build/luajit/clientpool/core.so
	@spec/nginx/fleet/run.sh

# The fleet across machines on Redis (docs/fleet.md section 14): its scripts
# against a real redis-server, and member processes standing in for
# machines (spec/redisfleet/*_redis.lua, not in the busted steps): under
# lua5.1 (PUC: no yield across pcall) and LuaJIT (the FFI binding), about
# 35 s each.
test-fleet-redis: build/lua5.1/clientpool/core.so build/luajit/clientpool/core.so
	@rc=0; for i in lua5.1 luajit; do \
	  scripts/busted-run.sh $$i '--lpath=./?.lua;$(LPATH)' "--cpath=./build/$$i/?.so" --pattern=_redis spec/redisfleet \
	    || rc=1; done; exit $$rc

# The fleet across machines in real nginx: two nginx instances as two
# machines (2 workers each, the agent in a worker's timer), a coordinating
# and a target redis-server, wrk on both at once (spec/nginx/redisfleet/run.sh,
# about 10 s).
test-nginx-redisfleet: build/luajit/clientpool/core.so
	@spec/nginx/redisfleet/run.sh

# A real Prometheus server (Debian's) scrapes clientpool.metrics from a
# server in the test process and the values read back through its HTTP API
# must match pool:stats() (spec/prometheus/scrape.lua; about 10 s).
test-prometheus: build/lua5.4/clientpool/core.so
	@$(call lua_env,build/lua5.4) LUA_PATH_5_4='./?.lua;$(LPATH);;' lua5.4 spec/prometheus/scrape.lua

# Build and install with LuaRocks into build/rocks, then run the lua5.4 specs
# against the installed tree only (no ./lua, no build/<interp> on the paths).
ROCKS_TREE := build/rocks
ROCKS_LPATH := ./$(ROCKS_TREE)/share/lua/5.4/?.lua;./$(ROCKS_TREE)/share/lua/5.4/?/init.lua
ROCKS_CPATH := ./$(ROCKS_TREE)/lib/lua/5.4/?.so
test-rocks:
	rm -rf $(ROCKS_TREE)
	@# luarocks builds in place (csrc/*.o, ./clientpool/core.so): remove those
	@# whatever happens, or ./?.so on the default cpath would find the module.
	$(LUAROCKS) --lua-version=5.4 make --tree=$(ROCKS_TREE) rockspec/clientpool-scm-1.rockspec; \
	  rc=$$?; rm -f csrc/*.o clientpool/core.so; rmdir clientpool 2>/dev/null; exit $$rc
	@lua5.4 -e "package.path = '$(ROCKS_LPATH);' .. package.path; \
	  package.cpath = '$(ROCKS_CPATH);' .. package.cpath; \
	  local m = assert(package.searchpath('clientpool', package.path)); \
	  local c = assert(package.searchpath('clientpool.core', package.cpath)); \
	  print('test-rocks: clientpool from ' .. m .. ', clientpool.core from ' .. c); \
	  assert(m:find('$(ROCKS_TREE)', 1, true) and c:find('$(ROCKS_TREE)', 1, true), \
	    'installed tree is not what the specs would load')"
	@scripts/busted-run.sh lua5.4 '--lpath=$(ROCKS_LPATH)' '--cpath=$(ROCKS_CPATH)' $(SPEC_ROOTS)

# Every lua/clientpool/**.lua must be listed in the rockspec (else the
# LuaRocks install lacks it) and every listed file must exist.
check-rockspec:
	@lua5.4 scripts/check-rockspec.lua rockspec/clientpool-scm-1.rockspec

lint:
	$(LUACHECK) $$([ -t 1 ] || echo --no-color) $(LINT_DIRS)

check-memory:
	@MAKE='$(MAKE)' scripts/run-steps.sh test-c-asan test-fleet-asan test-busted-asan

# The lua5.4 specs against build/asan-lua5.4 (ASan runtime preloaded).
test-busted-asan: build/asan-lua5.4/clientpool/core.so
	@test -f '$(ASAN_RT)' || { echo "check-memory: no ASan runtime found via $(CLANG)"; exit 1; }
	@echo "check-memory: lua5.4 busted with $(ASAN_RT) preloaded"
	@$(ASAN_ENV) BUSTED_PREFIX='env LD_PRELOAD=$(ASAN_RT)' CLIENTPOOL_SPEC_SCALE=0.05 \
	  scripts/busted-run.sh lua5.4 '--lpath=$(LPATH)' '--cpath=./build/asan-lua5.4/?.so' $(SPEC_ROOTS)

# ---------------------------------------------------------------- reliability

.PHONY: fuzz fuzz-ci fuzz-merge coverage soak soak-valgrind stress $(addprefix stress-,$(INTERPS)) stress-luajit-ffi

# The driver's model-checked random workload (spec/stress_spec.lua,
# spec/stress_model.lua, spec/stress_ops.lua) for longer than the 200 seeds each busted step of
# `make test` runs: STRESS_SEEDS seeds from STRESS_SEED on every interpreter
# and both LuaJIT backends. STRESS_FLAGS passes more, e.g.
# CLIENTPOOL_STRESS_PHYSICAL=1 (the physical cap) or
# CLIENTPOOL_STRESS_STRICT_DEADLINE=1; one seed with its trace:
# make stress-lua5.4 STRESS_SEEDS=1 STRESS_SEED=N STRESS_FLAGS=CLIENTPOOL_STRESS_TRACE=1
STRESS_SEEDS ?= 5000
STRESS_SEED  ?= 1
STRESS_FLAGS ?=
stress:
	@MAKE='$(MAKE)' scripts/run-steps.sh $(addprefix stress-,$(INTERPS)) stress-luajit-ffi

define stress_rule
stress-$(1): build/$(3)/clientpool/core.so
	@env CLIENTPOOL_STRESS_SEEDS=$$(STRESS_SEEDS) CLIENTPOOL_STRESS_SEED=$$(STRESS_SEED) $$(STRESS_FLAGS) \
	  CLIENTPOOL_BACKEND=$(2) scripts/busted-run.sh $(3) '--lpath=$$(LPATH)' '--cpath=./build/$(3)/?.so' \
	  spec/stress_spec.lua
endef
$(foreach i,$(INTERPS),$(eval $(call stress_rule,$(i),core,$(i))))
$(eval $(call stress_rule,luajit-ffi,ffi,luajit))

FUZZ_TIME    ?= 60
FUZZ_CI_TIME ?= 120
# make test's run is seeded and bounded by runs, so CI replays the same inputs
# on every machine (a new finding is make fuzz's job, not a random CI failure);
# FUZZ_CI_TIME only caps a slow machine
FUZZ_CI_SEED ?= 1
FUZZ_CI_RUNS ?= 8000
FUZZ_BIN     := build/fuzz/fuzz_engine
FUZZ_SRCS    := spec/c/fuzz_engine.c spec/c/fuzz_fleet.c spec/c/model.c spec/c/whitebox.c csrc/clock.c csrc/fleet.c

# libFuzzer + ASan + UBSan; the engine comes in through spec/c/whitebox.c.
$(FUZZ_BIN): $(FUZZ_SRCS) csrc/engine.c $(wildcard csrc/*.h spec/c/*.h)
	@mkdir -p $(@D)
	$(CLANG) $(WARNFLAGS) $(SANFLAGS) -fsanitize=fuzzer -Icsrc -o $@ $(FUZZ_SRCS) $(LIBS)

fuzz: $(FUZZ_BIN)
	@scripts/fuzz.sh $(FUZZ_BIN) $(FUZZ_TIME)

fuzz-ci: $(FUZZ_BIN)
	@scripts/fuzz.sh $(FUZZ_BIN) $(FUZZ_CI_TIME) -seed=$(FUZZ_CI_SEED) -runs=$(FUZZ_CI_RUNS)

fuzz-merge: $(FUZZ_BIN)
	@scripts/fuzz.sh $(FUZZ_BIN) merge

# Branch coverage of csrc/engine.c from the C tests and the lua5.4 specs.
COVERAGE_MIN ?= 95
coverage:
	@CC=gcc COVERAGE_MIN=$(COVERAGE_MIN) scripts/coverage.sh

# 10k coroutines, 1M acquisitions under random hook failures; prints the Lua
# heap after warm-up and at the end (SOAK_ARGS to change, see bench/soak.lua).
SOAK_INTERP ?= lua5.4
SOAK_ARGS   ?=
soak: build/$(SOAK_INTERP)/clientpool/core.so
	$(call lua_env,build/$(SOAK_INTERP)) $(SOAK_INTERP) bench/soak.lua $(SOAK_ARGS)

# A shorter soak under valgrind memcheck (a step of make test): no leak, no
# invalid access; the interpreter closes its state at the end, so everything
# must be freed. Its heap margin is loose: at this size the warm-up (a fifth
# of the run) ends before every coroutine's stack has reached its deepest
# path, so the heap still grows ~10 % afterwards; make soak is the tight check.
SOAK_VALGRIND_ARGS ?= --coroutines 1000 --acquisitions 100000 --margin 0.25
# The binding's C fast path (clientpool.core.fastpath: checkout, checkin,
# acquire, release) under valgrind, through the specs that drive it on a
# real clock: Debian's Lua has no API checks, and an overflow of a C
# function's Lua stack stays inside Lua's own block where ASan does not
# look; valgrind caught one. About a minute for both.
test-valgrind-%: build/%/clientpool/core.so
	@BUSTED_PREFIX="valgrind --quiet --error-exitcode=99" CLIENTPOOL_BACKEND=core CLIENTPOOL_SPEC_SCALE=0.06 \
	  scripts/busted-run.sh $* \
	  '--lpath=$(LPATH)' '--cpath=./build/$*/?.so' spec/checkout_spec.lua spec/acquire_spec.lua spec/acquire_lifecycle_spec.lua \
	  spec/lease_spec.lua spec/leak_spec.lua spec/stats_spec.lua

soak-valgrind: build/lua5.4/clientpool/core.so
	$(call lua_env,build/lua5.4) valgrind --quiet --error-exitcode=99 --leak-check=full \
	  --show-leak-kinds=definite,indirect,possible --errors-for-leak-kinds=definite,indirect,possible \
	  lua5.4 bench/soak.lua $(SOAK_VALGRIND_ARGS)

# ---------------------------------------------------------------- other

# The flagship: an nginx gateway (4 workers) reading redis through
# lua-resty-redis under wrk, clientpool's cpngx.driver against bare
# keepalive (pool_size) and backlog; a table and build/demo/connections.svg
# (examples/gateway/run.sh, about 30 s; everything it starts is stopped).
demo: deps
	@$(MAKE) --no-print-directory build/luajit/clientpool/core.so
	@examples/gateway/run.sh

# The plain-Lua quick start: simulated clients on the built-in loop.
demo-lua: deps
	@$(MAKE) --no-print-directory build/lua5.4/clientpool/core.so
	$(call lua_env,build/lua5.4) lua5.4 examples/quickstart.lua

# Each interpreter runs bench/run.lua (a table of its own, rows kept in
# build/bench/*.tsv); bench/report.lua then prints one Markdown table with
# a column per interpreter. "luajit -joff" runs with the JIT off.
BENCH_RUNS := lua5.1 lua5.3 lua5.4 luajit-joff luajit
build/bench/engine_pair: bench/c/engine_pair.c $(ENGINE_SRCS) $(wildcard csrc/*.h)
	@mkdir -p $(@D)
	$(CC) $(WARNFLAGS) -O2 -Icsrc -o $@ bench/c/engine_pair.c $(ENGINE_SRCS) $(LIBS)

build/bench/coarse_lag: bench/c/coarse_lag.c
	@mkdir -p $(@D)
	$(CC) $(WARNFLAGS) -O2 -o $@ bench/c/coarse_lag.c

build/bench/fleet_pair: bench/c/fleet_pair.c $(ENGINE_SRCS) $(wildcard csrc/*.h)
	@mkdir -p $(@D)
	$(CC) $(WARNFLAGS) -O2 -Icsrc -o $@ bench/c/fleet_pair.c $(ENGINE_SRCS) $(LIBS)

bench: all build/bench/engine_pair build/bench/fleet_pair build/bench/coarse_lag
	@mkdir -p build/bench
	@echo "== the engine alone (C, no Lua; absolute figures, a diagnostic)"
	@build/bench/engine_pair
	@echo "== the clocks (C; docs/performance.md \"The coarse clock\", a diagnostic)"
	@build/bench/coarse_lag
	@echo "== what the fleet adds to that pair (C; docs/fleet.md, a diagnostic for B7)"
	@build/bench/fleet_pair
	@set -e; for r in $(BENCH_RUNS); do \
	  case $$r in luajit-joff) i=luajit; flags=-joff ;; *) i=$$r; flags= ;; esac; \
	  env LUA_PATH='$(LPATH);;' LUA_PATH_5_3='$(LPATH);;' LUA_PATH_5_4='$(LPATH);;' \
	      LUA_CPATH="./build/$$i/?.so;;" LUA_CPATH_5_3="./build/$$i/?.so;;" LUA_CPATH_5_4="./build/$$i/?.so;;" \
	      $$i $$flags bench/run.lua --out build/bench/$$r.tsv; \
	done
	@echo
	@lua5.4 bench/report.lua $(foreach r,$(BENCH_RUNS),build/bench/$(r).tsv)
	@if command -v nginx >/dev/null 2>&1 && [ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]; then \
	  echo; $(MAKE) --no-print-directory bench-nginx; \
	else echo; echo "bench: no nginx with the Lua module: B5 and B6 skipped (make bench-nginx)"; fi

# B5 and B6 in a private nginx (2 workers) and redis-server on 127.0.0.1,
# both always stopped (bench/nginx/run.sh, about 40 s; rows in
# build/bench/nginx.tsv). Not part of `make test`.
bench-nginx: build/luajit/clientpool/core.so
	@bench/nginx/run.sh

# clientpool.http against lua-http's own request:go() (a connection per
# request): TCP connections nginx saw and requests/s, in a private nginx
# (bench/http_pool.lua). lua-http loads on LuaJIT and Lua 5.1 only.
BENCH_HTTP_LUA ?= luajit
bench-http: build/$(BENCH_HTTP_LUA)/clientpool/core.so
	$(call lua_env,build/$(BENCH_HTTP_LUA)) LUA_PATH='./?.lua;$(LPATH);;' $(BENCH_HTTP_LUA) bench/http_pool.lua $(BENCH_HTTP_ARGS)

install: module
	install -d '$(DESTDIR)$(LUA_CMODDIR)/clientpool'
	install -m 755 build/module/clientpool/core.so '$(DESTDIR)$(LUA_CMODDIR)/clientpool/core.so'
	cd lua && find clientpool -name '*.lua' | while read -r f; do \
	  install -D -m 644 "$$f" '$(DESTDIR)$(LUA_SHAREDIR)'/"$$f" || exit 1; done

# lua/clientpool/cdef.lua and fleet_cdef.lua: the headers without their
# preprocessor lines, for ffi.cdef.
define cdef_gen
	@if sed '/^#/d' $(1) | grep -q ']]'; then \
	  echo "cdef: $(1) contains ']]', which would end the long string"; exit 1; fi
	@{ echo '-- Generated by `make cdef` from $(1): do not edit.'; \
	  echo 'return [['; sed '/^#/d' $(1); echo ']]'; } > $(2).tmp
	@mv $(2).tmp $(2)
	@echo "cdef: wrote $(2)"
endef
cdef:
	$(call cdef_gen,csrc/clientpool.h,lua/clientpool/cdef.lua)
	$(call cdef_gen,csrc/fleet.h,lua/clientpool/fleet_cdef.lua)

clean:
	rm -rf build luacov.stats.out luacov.report.out
	rm -f csrc/*.o clientpool/core.so
	rmdir clientpool 2>/dev/null || true
