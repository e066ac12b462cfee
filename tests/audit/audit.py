#!/usr/bin/env python3
"""Bad-input and fault audit of a cocodiff build: every bad input must exit 2 (3 for an injected
fault) with a message naming a file, line or key, never 1 and never a signal, and leave nothing
half-written. Usage: audit.py COCODIFF SOURCE_DIR WORK_DIR [--quick]"""
import json, os, re, signal, struct, subprocess, sys, time, zlib, shutil

BIN, SRC, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
QUICK = '--quick' in sys.argv
os.makedirs(WORK, exist_ok=True)
GOOD = os.path.join(SRC, 'tests/apps/data/good.toml')
SMOKE = os.path.join(SRC, 'configs/mpi-smoke.toml')
SNEAKER = os.path.join(SRC, 'tests/e2e/data/fmnist_test_sneaker.png')
results = []  # (name, ok, detail)

def run(args, timeout=120, env=None, preexec=None, cwd=None):
    t0 = time.time()
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout,
                       env=env, preexec_fn=preexec, cwd=cwd, errors='replace')
    return p.returncode, p.stdout, p.stderr, time.time() - t0

def names_something(err, hints):
    if any(h and h in err for h in hints): return True
    return bool(re.search(r"(key '[^']+'|\.toml(:\d+)?|\.safetensors|\.png|--set |--[a-z-]+|rank \d+|tensor '|line \d+)", err))

def expect(name, args, codes=(2,), hints=(), out=None, allow_ok=False, **kw):
    try:
        rc, o, e, dt = run(args, **kw)
    except subprocess.TimeoutExpired:
        results.append((name, False, 'timeout (hang)')); return None
    ok = True; why = []
    if rc < 0: ok = False; why.append('signal %d' % -rc)
    elif rc == 1: ok = False; why.append('exit 1')
    elif rc == 0 and not allow_ok: ok = False; why.append('exit 0 (accepted)')
    elif rc not in codes and rc != 0: ok = False; why.append('exit %d' % rc)
    if rc in codes and rc != 0 and not names_something(e, hints):
        ok = False; why.append('message names nothing')
    if rc not in (0,) and out and os.path.exists(out) and os.listdir(out):
        ok = False; why.append('outputs left')
    if out:
        parent = os.path.dirname(out.rstrip('/')) or '.'
        if os.path.isdir(parent):
            tmps = [f for f in os.listdir(parent) if '.tmp.' in f]
            if tmps and rc != 0: ok = False; why.append('temporaries left: %s' % tmps[:3])
    results.append((name, ok, ('; '.join(why) + ' | ' if why else '') + 'exit %d: %s' % (rc, e.strip().splitlines()[-1][:160] if e.strip() else '')))
    return rc, o, e

def w(path, data, mode='w'):
    with open(path, mode) as f: f.write(data)
    return path

# --- 1. every resolved key with bad values (validate; run for a sample) -------------------------
rc, dump, err, _ = run(['validate', GOOD, '--dump'])
keys = []
section = ''
for line in dump.splitlines():
    s = line.strip()
    if not s or s.startswith('#'): continue
    m = re.match(r'^\[(.+)\]$', s)
    if m: section = m.group(1); continue
    m = re.match(r'^([A-Za-z0-9_-]+) = ', s)
    if m: keys.append((section + '.' if section else '') + m.group(1))
bad_values = ['-1', '0', '1e300', '-1e300', 'nan', 'inf', '-inf', '"x"', 'true', '[]', '[1,2]',
              '9223372036854775807', '-9223372036854775808', '1e-320', '""', '{a=1}', '0.5']
if QUICK: bad_values = bad_values[:6]
out = os.path.join(WORK, 'out')
for i, k in enumerate(keys):
    for v in bad_values:
        expect('validate %s=%s' % (k, v), ['validate', GOOD, '--set', '%s=%s' % (k, v)],
               hints=(k,), allow_ok=True)
        if i % 5 == 0:
            shutil.rmtree(out, ignore_errors=True)
            expect('run %s=%s' % (k, v), ['run', GOOD, '--out', out, '-q', '--set', '%s=%s' % (k, v)],
                   hints=(k,), out=out, allow_ok=True, timeout=300)
# Extra keys that the dump does not show (defaults the good config leaves out).
for k in ['run.inpaint_rect', 'run.weights', 'run.initial_latent', 'run.class_label', 'run.height',
          'run.width', 'run.batch_size', 'parallel.ulysses_degree', 'parallel.ring_degree',
          'parallel.cfg_degree', 'mpi.progress_timeout_s', 'mpi.progress_floor_s',
          'mpi.progress_multiple', 'emulator.memory_limit', 'run.resolution', 'v_major.threshold']:
    for v in bad_values:
        expect('validate %s=%s' % (k, v), ['validate', GOOD, '--set', '%s=%s' % (k, v)], hints=(k,),
               allow_ok=True)

# --- 2. config files that are not configs ------------------------------------------------------
d = os.path.join(WORK, 'files'); os.makedirs(d, exist_ok=True)
good = open(GOOD).read()
cases = {
    'syntax': 'x = = 1\n', 'binary': '\x00\x01\x02\xff', 'empty': '',
    'quoted_dot': '"run.seed" = -5\n' + good, 'quoted_dot_alone': '"run.steps" = 3\n',
    'quoted_cluster': '"cluster.nodes" = -5\n' + good,
    'deep_table': good + '\n[cluster.topology]\n"a.b" = 1\n',
    'empty_weights': good.replace('seed = 1', 'seed = 1\nweights = ""'),
    'empty_latent': good.replace('seed = 1', 'seed = 1\ninitial_latent = ""'),
    'dup_key': good + '\n[run]\nseed = 2\n', 'unicode_key': good + '\n[run]\n"sëed" = 2\n',
    'huge_int': good.replace('seed = 1', 'seed = 99999999999999999999'),
    'inpaint_rect_overflow': '[model]\npreset = "flux1-fmnist"\n[run]\nresolution = 28\nmath = "skip"\n'
        'inpaint_image = "%s"\ninpaint_rect = [9223372036854775807, 0, 2, 1]\n[cluster]\npreset = "uniform"\nnodes = 1\n' % SNEAKER,
    'inpaint_rect_overflow2': '[model]\npreset = "flux1-fmnist"\n[run]\nresolution = 28\nmath = "skip"\n'
        'inpaint_image = "%s"\ninpaint_rect = [1, 0, 9223372036854775807, 1]\n[cluster]\npreset = "uniform"\nnodes = 1\n' % SNEAKER,
}
for n, text in cases.items():
    p = w(os.path.join(d, n + '.toml'), text)
    expect('config ' + n + ' (validate)', ['validate', p], hints=(p,))
    shutil.rmtree(out, ignore_errors=True)
    expect('config ' + n + ' (run)', ['run', p, '--out', out, '-q'], hints=(p,), out=out)
# Bare file name in its own directory (an empty directory part).
w(os.path.join(d, 'emptyw.toml'), cases['empty_weights'])
expect('bare emptyw.toml', ['run', 'emptyw.toml', '--out', out, '-q'], cwd=d, hints=('run.weights',), out=out)
expect('bare --set run.initial_latent=""', ['run', 'emptyw.toml', '--out', out, '-q', '--set',
       'run.weights=x', '--set', 'run.initial_latent=""'], cwd=d, out=out)
for special in ['/dev/zero', '/dev/null', d, '/nonexistent/x.toml']:
    expect('config path ' + special, ['validate', special], hints=(special,))
os.mkfifo(os.path.join(d, 'fifo.toml')) if not os.path.exists(os.path.join(d, 'fifo.toml')) else None
expect('config fifo', ['validate', os.path.join(d, 'fifo.toml')], timeout=20)
# --set forms
for s in ['run.steps=1\nrun.seed=-7', 'run.steps', '=3', 'run..steps=1', 'run.steps=1\r', '"run.seed"=3',
          'cluster={"nodes.x"=1}', 'run=1', 'run.steps.x=1', 'a\nb=1']:
    expect('--set %r' % s, ['validate', GOOD, '--set', s])

# --- 3. checkpoints and latents ----------------------------------------------------------------
def st(path, tensors):
    hdr = {}; data = b''
    for name, dt, shape, raw in tensors:
        hdr[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode(); h += b' ' * ((8 - len(h) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + data)
    return path
# flux1-tiny spec list from `weights`
rc, listing, _, _ = run(['weights', 'flux1-tiny'])
specs = []
for line in listing.splitlines():
    m = re.match(r'^\s+(\S+)\s+\[([0-9, x]+)\]', line)
    if m: specs.append((m.group(1), [int(x) for x in re.findall(r'\d+', m.group(2))]))
def ckpt(name, value_of):
    ts = []
    for n, shape in specs:
        cnt = 1
        for s in shape: cnt *= s
        ts.append((n, 'F32', shape, struct.pack('<f', value_of(n)) * cnt))
    return st(os.path.join(d, name), ts)
tiny = lambda extra: w(os.path.join(d, 'tiny.toml'), '[model]\npreset = "flux1-tiny"\n[run]\nresolution = 64\nsteps = 1\nmath = "real"\n%s\n[cluster]\npreset = "uniform"\nnodes = 1\n[emulator]\nworkers = 1\n' % extra)
if specs:
    for name, f in [('nan', lambda n: float('nan') if n.endswith('bias') else 0.01),
                    ('inf', lambda n: float('inf') if 'proj_out' in n else 0.01),
                    ('huge', lambda n: 3e38 if n.startswith('transformer_blocks.1.') else 0.01),
                    ('hugeall', lambda n: 3.4e38)]:
        p = ckpt(name + '.safetensors', f)
        shutil.rmtree(out, ignore_errors=True)
        expect('weights %s (run)' % name, ['run', tiny('weights = "%s"' % p), '--out', out, '-q'], out=out, hints=(p, 'first appear'))
        # Finite values, however large, are a well-formed checkpoint: --check passes them.
        expect('weights %s (weights --check)' % name, ['weights', 'flux1-tiny', '--check', p], hints=(p,),
               allow_ok=name.startswith('huge'))
    p = os.path.join(d, 'trunc.safetensors'); open(p, 'wb').write(open(os.path.join(d, 'nan.safetensors'), 'rb').read()[:5000])
    expect('weights truncated', ['run', tiny('weights = "%s"' % p), '--out', out, '-q'], out=out)
    expect('weights --check truncated', ['weights', 'flux1-tiny', '--check', p])
for n, data in [('empty', b''), ('header_tb', struct.pack('<Q', 10**12)), ('garbage', os.urandom(4096)),
                ('json_only', struct.pack('<Q', 2) + b'{}')]:
    p = os.path.join(d, n + '.safetensors'); open(p, 'wb').write(data)
    expect('weights ' + n, ['run', tiny('weights = "%s"' % p), '--out', out, '-q'], out=out)
    expect('weights --check ' + n, ['weights', 'flux1-tiny', '--check', p])
for n, val, shape in [('latent_nan', float('nan'), [16, 8, 8]), ('latent_huge', 3e38, [16, 8, 8]),
                      ('latent_shape', 0.1, [16, 4, 4])]:
    p = st(os.path.join(d, n + '.safetensors'), [('latent', 'F32', shape, struct.pack('<f', val) * (shape[0] * shape[1] * shape[2]))])
    shutil.rmtree(out, ignore_errors=True)
    expect('initial ' + n, ['run', tiny('initial_latent = "%s"' % p), '--out', out, '-q'], out=out)

# --- 4. PNG inputs -----------------------------------------------------------------------------
def ch(t, dd): return struct.pack('>I', len(dd)) + t + dd + struct.pack('>I', zlib.crc32(t + dd))
def png(wd, ht): return b'\x89PNG\r\n\x1a\n' + ch(b'IHDR', struct.pack('>II', wd, ht) + bytes([8, 2, 0, 0, 0])) + ch(b'IDAT', zlib.compress(b'\0' * 4)) + ch(b'IEND', b'')
pngs = {'big': png(30000, 30000), 'max': png(2**31 - 1, 2**31 - 1), 'zero': png(0, 0), 'wrong': png(27, 28),
        'trunc': png(28, 28)[:30], 'notpng': b'hello', 'empty': b''}
for n, data in pngs.items():
    p = os.path.join(d, 'img_' + n + '.png'); open(p, 'wb').write(data)
    for key, base in [('inpaint_image', 'inpaint_rect = [1, 1, 2, 2]'), ('inpaint_mask', 'inpaint_image = "%s"' % SNEAKER)]:
        cfg = w(os.path.join(d, 'inp.toml'), '[model]\npreset = "flux1-fmnist"\n[run]\nresolution = 28\nmath = "skip"\n%s\n%s = "%s"\n[cluster]\npreset = "uniform"\nnodes = 1\n' % (base, key, p))
        t0 = time.time()
        expect('png %s as %s' % (n, key), ['validate', cfg], hints=('run.' + key,))
        if time.time() - t0 > 3: results.append(('png %s as %s fast' % (n, key), False, 'took %.1f s' % (time.time() - t0)))
for special in ['/dev/zero', d]:
    cfg = w(os.path.join(d, 'inp.toml'), '[model]\npreset = "flux1-fmnist"\n[run]\nresolution = 28\nmath = "skip"\ninpaint_rect = [1, 1, 2, 2]\ninpaint_image = "%s"\n[cluster]\npreset = "uniform"\nnodes = 1\n' % special)
    expect('png path %s' % special, ['validate', cfg], timeout=20, hints=('run.inpaint_image',))

# --- 5. forward ---------------------------------------------------------------------------------
rc, listing, _, _ = run(['weights', 'dit-xl-2-tiny'])
dspecs = []
for line in listing.splitlines():
    m = re.match(r'^\s+(\S+)\s+\[([0-9, x]+)\]', line)
    if m: dspecs.append((m.group(1), [int(x) for x in re.findall(r'\d+', m.group(2))]))
def dckpt(name, val):
    ts = []
    for n, shape in dspecs:
        cnt = 1
        for s in shape: cnt *= s
        ts.append((n, 'F32', shape, struct.pack('<f', val) * cnt))
    return st(os.path.join(d, name), ts)
dw = dckpt('dit.safetensors', 0.01); dh = dckpt('dit_huge.safetensors', 3.4e38)
lat = struct.pack('<f', 0.1) * (4 * 8 * 8)
for label in [11, -1, 1e9, 2.5, 10.5]:
    inp = st(os.path.join(d, 'in.safetensors'), [('latent', 'F32', [4, 8, 8], lat), ('sigma', 'F32', [1], struct.pack('<f', 0.5)),
                                                 ('class_label', 'F32', [1], struct.pack('<f', label))])
    o = os.path.join(d, 'fwd_out.safetensors')
    if os.path.exists(o): os.remove(o)
    expect('forward class_label %s' % label, ['forward', '--model', 'dit-xl-2-tiny', '--weights', dw, '--input', inp, '--output', o], hints=('class_label',))
    if os.path.exists(o): results.append(('forward class_label %s wrote output' % label, False, o))
inp = st(os.path.join(d, 'in.safetensors'), [('latent', 'F32', [4, 8, 8], lat), ('sigma', 'F32', [1], struct.pack('<f', 0.5))])
o = os.path.join(d, 'fwd_out.safetensors')
if os.path.exists(o): os.remove(o)
expect('forward huge weights', ['forward', '--model', 'dit-xl-2-tiny', '--weights', dh, '--input', inp, '--output', o], hints=('first appear',))
if os.path.exists(o): results.append(('forward huge weights wrote output', False, o))
for n, tensors in [('no_latent', [('sigma', 'F32', [1], struct.pack('<f', 0.5))]),
                   ('latent_zero', [('latent', 'F32', [4, 0, 8], b''), ('sigma', 'F32', [1], struct.pack('<f', 0.5))]),
                   ('latent_odd', [('latent', 'F32', [4, 7, 8], struct.pack('<f', 0.1) * 224), ('sigma', 'F32', [1], struct.pack('<f', 0.5))]),
                   ('sigma_2', [('latent', 'F32', [4, 8, 8], lat), ('sigma', 'F32', [1], struct.pack('<f', 2))])]:
    inp = st(os.path.join(d, 'in.safetensors'), tensors)
    expect('forward ' + n, ['forward', '--model', 'dit-xl-2-tiny', '--weights', dw, '--input', inp, '--output', o])

# --- 6. faults, signals, compare output sets ---------------------------------------------------
shutil.rmtree(out, ignore_errors=True)
expect('inject fault', ['run', GOOD, '--out', out, '-q', '--inject-fault', 'rank=1,step=1'], codes=(3,), hints=('rank 1',))
for spec in ['rank=99,step=0', 'rank=1,step=99', 'rank=-1,step=0', 'rank=1', 'kind=boom', 'rank=1,step=0,kind=hang']:
    shutil.rmtree(out, ignore_errors=True)
    expect('inject-fault ' + spec, ['run', GOOD, '--out', out, '-q', '--inject-fault', spec], hints=('--inject-fault',), out=out)
def seeds_of(dirp):
    names = sorted(n for n in os.listdir(dirp) if n != '.cocodiff-output')  # every set's marker
    if names != ['compare.json', 'flat', 'tapa']: return None
    doc = json.load(open(os.path.join(dirp, 'compare.json')))
    s = int(doc['sets'][-1].split('=')[1])
    for n in ('flat', 'tapa'):
        if json.load(open(os.path.join(dirp, n, 'report.json')))['seed'] != s: return None
    return s
cmpout = os.path.join(WORK, 'cmp', 'out')
def compare(seed, env=None, preexec=None):
    return run(['compare', GOOD, '--strategies', 'flat,tapa', '--outputs', '--out', cmpout, '--set',
                'emulator.trace=false', '--set', 'run.seed=%d' % seed], env=env, preexec=preexec)
shutil.rmtree(os.path.dirname(cmpout), ignore_errors=True); os.makedirs(os.path.dirname(cmpout))
compare(42)
ref = seeds_of(cmpout)
for point in range(1, 30):
    env = dict(os.environ, COCODIFF_TEST_KILL_AT_WRITE=str(point))
    rc, _, e, _ = compare(7, env=env)
    s = seeds_of(cmpout)
    results.append(('compare kill at write %d' % point, s in (42, 7), 'exit %d, set of seed %s' % (rc, s)))
    if rc == 0: break
    shutil.rmtree(cmpout); compare(42)
def fsize_limit(n):
    def f():
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    return f
compare(42)
for limit in [100, 1000, 2000]:  # below compare.json's ~3 KB
    rc, _, e, _ = compare(7, preexec=fsize_limit(limit))
    s = seeds_of(cmpout)
    results.append(('compare full disk at %d B' % limit, rc == 2 and s == 42 and not [f for f in os.listdir(os.path.dirname(cmpout)) if '.tmp' in f],
                    'exit %d, set of seed %s: %s' % (rc, s, e.strip().splitlines()[-1][:120] if e.strip() else '')))
# run with a full disk and a kill mid-run: old set intact
shutil.rmtree(out, ignore_errors=True)
run(['run', GOOD, '--out', out, '-q', '--set', 'run.seed=42'])
for limit in [100, 2000]:
    rc, _, e, _ = run(['run', GOOD, '--out', out, '-q', '--set', 'run.seed=7'], preexec=fsize_limit(limit))
    seed = json.load(open(os.path.join(out, 'report.json')))['seed'] if os.path.exists(os.path.join(out, 'report.json')) else None
    results.append(('run full disk at %d B' % limit, rc == 2 and seed == 42, 'exit %d seed %s' % (rc, seed)))
# signals
for sig, code in [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]:
    o2 = os.path.join(WORK, 'sig_out'); shutil.rmtree(o2, ignore_errors=True)
    p = subprocess.Popen([BIN, 'run', GOOD, '--out', o2, '--set', 'model.preset=flux1-dev', '--set', 'cluster.preset=aurora',
                          '--set', 'cluster.nodes=2', '--set', 'run.resolution=1024', '--set', 'run.steps=100000'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(3); p.send_signal(sig)
    try:
        e = p.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        p.kill(); e = 'hang'
    results.append(('signal %s' % sig.name, p.returncode == code and 'interrupted by' in e and not (os.path.exists(o2) and os.listdir(o2)),
                    'exit %s: %s' % (p.returncode, e.strip()[:120])))

# signals at the other phases: start-up (0.2 s after the launch: the config read and the run
# planned) and the write phase (the staging directory beside --out has appeared), each over an
# earlier output set that must stay as it was, with no staging directory left beside it
o4 = os.path.join(WORK, 'sig_phase', 'out')
shutil.rmtree(os.path.dirname(o4), ignore_errors=True); os.makedirs(os.path.dirname(o4))
phase_args = ['run', GOOD, '--out', o4, '-q', '--set', 'model.preset=flux1-dev', '--set', 'cluster.preset=aurora',
              '--set', 'cluster.nodes=2', '--set', 'run.resolution=1024', '--set', 'emulator.trace=true']
run(phase_args + ['--set', 'run.steps=6', '--set', 'run.seed=1'])
old_report = open(os.path.join(o4, 'report.json')).read() if os.path.exists(os.path.join(o4, 'report.json')) else None
staging = lambda: [f for f in os.listdir(os.path.dirname(o4)) if f.startswith('.out.tmp.')]
for phase in ['start-up', 'write']:
    for sig, code in [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]:
        p = subprocess.Popen([BIN] + phase_args + ['--set', 'run.steps=6', '--set', 'run.seed=2'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = True
        if phase == 'start-up':
            time.sleep(0.2)
        else:
            deadline = time.time() + 120
            while not staging() and time.time() < deadline and p.poll() is None: time.sleep(0.005)
            seen = bool(staging())
        t0 = time.time(); p.send_signal(sig)
        try:
            e = p.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            p.kill(); e = 'hang'
        dt = time.time() - t0
        kept = os.path.exists(os.path.join(o4, 'report.json')) and open(os.path.join(o4, 'report.json')).read() == old_report
        results.append(('signal %s at %s' % (sig.name, phase),
                        old_report is not None and seen and p.returncode == code and kept and not staging() and dt < 5,
                        'exit %s in %.2f s, previous set %s: %s' % (p.returncode, dt, 'kept' if kept else 'CHANGED',
                                                                 e.strip()[:120])))

# --- 7. MPI: mismatched runs, a stopped rank, an injected fault --------------------------------
mpirun = shutil.which('mpirun')
if mpirun:
    def mpi(name, args, codes, want, timeout=120):
        o3 = os.path.join(WORK, 'mpi_out'); shutil.rmtree(o3, ignore_errors=True)
        args = [a.replace('OUT', o3) for a in args]
        t0 = time.time()
        try:
            p = subprocess.run([mpirun, '--allow-run-as-root', '--oversubscribe'] + args, capture_output=True,
                               text=True, timeout=timeout, errors='replace')
            rc, e = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            rc, e = 124, 'timeout'
        written = os.path.exists(o3) and os.listdir(o3)
        ok = rc in codes and want in e and (not written or rc == 3)
        results.append(('mpi ' + name, ok, 'exit %d after %.0f s, %s' % (rc, time.time() - t0, 'found' if want in e else 'missing: ' + want)))
    base = [BIN, 'run', SMOKE, '--backend', 'mpi', '--out', 'OUT', '-q']
    mpi('mpmd seed', ['-np', '2'] + base + ['--set', 'run.seed=7', ':', '-np', '2'] + base + ['--set', 'run.seed=8'], (2,),
        'ranks 2, 3 differ from ranks 0, 1 in run.seed (7 vs 8)')
    mpi('mpmd strategy', ['-np', '2'] + base + ['--set', 'run.strategy=flat', ':', '-np', '2'] + base + ['--set', 'run.strategy=tapa'], (2,),
        "in run.strategy ('flat' vs 'tapa')")
    mpi('mpmd fault spec', ['-np', '2'] + base + ['--inject-fault', 'rank=1,step=1', ':', '-np', '2'] + base, (2,), '(--inject-fault)')
    mpi('hang, default watchdog, floor 2 s', ['-np', '4'] + base + ['--inject-fault', 'rank=2,step=1,kind=hang', '--set',
        'mpi.progress_floor_s=2', '--set', 'mpi.progress_multiple=3'], (2,), 'stopped rank(s): 2 ')
    mpi('injected fault', ['-np', '4'] + base + ['--inject-fault', 'rank=1,step=1'], (3,), 'rank 1: injected fault')
    mpi('rank count', ['-np', '3'] + base, (2,), 'the MPI job has 3 ranks')

# --- Nothing runs that the user did not write, nothing is lost, nothing dies ---
# Injections: a control character in a config string is refused naming the key, and no gnuplot
# command runs (the mark file would appear).
mark = os.path.join(WORK, 'planted_mark')
for key in ('cluster.name', 'model.name', 'cluster.topology.node_tier'):
    inj = '"x\\n!touch %s\\n#"' % mark
    expect('injection through ' + key, ['validate', GOOD, '--set', '%s=%s' % (key, inj)], hints=(key,))
    expect('injection run through ' + key, ['run', GOOD, '-q', '--out', os.path.join(WORK, 'inj'),
           '--set', '%s=%s' % (key, inj)], hints=(key,), out=os.path.join(WORK, 'inj'))
nl_out = os.path.join(WORK, 'a\n!touch %s\n#' % mark)
rc, o, e, dt = run(['run', GOOD, '-q', '--out', nl_out])
results.append(('--out holding a gnuplot command', rc == 0 and not os.path.exists(mark), 'exit %d, mark %s' % (rc, os.path.exists(mark))))
shutil.rmtree(nl_out, ignore_errors=True)
# --out: a directory that is not an earlier output set is refused, its files kept.
mine = os.path.join(WORK, 'mine'); shutil.rmtree(mine, ignore_errors=True); os.makedirs(os.path.join(mine, 'sub'))
w(os.path.join(mine, 'notes.txt'), 'keep'); w(os.path.join(mine, 'sub', 'data.csv'), '1,2')
for cmd in (['run', GOOD], ['compare', GOOD], ['tune', GOOD, '--nodes', '1']):
    rc, o, e, dt = run(cmd + ['--out', mine])
    kept = os.path.exists(os.path.join(mine, 'notes.txt')) and os.path.exists(os.path.join(mine, 'sub', 'data.csv'))
    results.append(('--out of the user\'s files (%s)' % cmd[0], rc == 2 and kept and 'not an earlier output set' in e, 'exit %d kept %s' % (rc, kept)))
rc, o, e, dt = run(['run', GOOD, '--out', '.', '--force'], cwd=mine)
results.append(('--out . refused', rc == 2 and 'working directory' in e and os.path.exists(os.path.join(mine, 'notes.txt')), 'exit %d: %s' % (rc, e.strip()[-120:])))
# Planted symlinks where the old predictable temporaries went: never written through.
victim = os.path.join(WORK, 'victim.txt'); w(victim, 'precious')
fit = os.path.join(WORK, 'fit_sym.json')
for n in range(16):
    pth = '%s.tmp.%d.%d' % (fit, os.getpid(), n)
    if not os.path.lexists(pth): os.symlink(victim, pth)
rc, o, e, dt = run(['netbench', 'uniform', '-b', '1K', '-e', '1K', '--json', fit])
results.append(('planted symlink temporaries', rc == 0 and open(victim).read() == 'precious', 'exit %d' % rc))
# FIFOs named as checkpoints and indexes: refused at once, never blocking.
for name in ('fifo.safetensors', 'fifo.safetensors.index.json'):
    f = os.path.join(WORK, name)
    if os.path.lexists(f): os.remove(f)
    os.mkfifo(f)
    expect('FIFO ' + name + ' (weights --check)', ['weights', 'flux1-tiny', '--check', f], hints=(name,), timeout=20)
    expect('FIFO ' + name + ' (run.weights)', ['validate', GOOD, '--set', 'run.math=real', '--set', 'run.weights="%s"' % f], hints=(name,), timeout=20)
# Huge ancillary PNG chunks: refused at once, not 2 GB allocated.
for t in (b'tEXt', b'zTXt', b'iTXt', b'sPLT'):
    pth = os.path.join(WORK, 'huge_%s.png' % t.decode())
    body = png(28, 28)
    data = body[:33] + struct.pack('>I', 0x7fffffff) + t + b'Comment\0x' + body[33:]
    w(pth, data, 'wb')
    rc, o, e, dt = run(['validate', os.path.join(SRC, 'configs/quickstart.toml'), '--set', 'run.inpaint_image="%s"' % pth,
                        '--set', 'run.inpaint_rect=[0,0,4,4]'], timeout=30)
    results.append(('PNG with a 2^31-byte %s chunk' % t.decode(), rc == 2 and dt < 5, 'exit %d after %.1f s' % (rc, dt)))
# Many-tensor headers: linear time.
hdr = '{' + ','.join('"t%d":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}' % (i, 4 * i, 4 * i + 4) for i in range(64000)) + '}'
many = os.path.join(WORK, 'many.safetensors')
w(many, struct.pack('<Q', len(hdr)) + hdr.encode() + b'\0' * (4 * 64000), 'wb')
rc, o, e, dt = run(['weights', 'flux1-tiny', '--check', many], timeout=60)
results.append(('64,000-tensor header', rc == 2 and dt < 10, 'exit %d after %.1f s' % (rc, dt)))
# Rank counts up to 32k: refused before the run (memory or memory mappings), never a crash.
for nodes in (4096, 8192):
    expect('%d-rank validate' % (4 * nodes), ['validate', GOOD, '--set', 'cluster.nodes=%d' % nodes, '--set', 'run.resolution=4096',
           '--set', 'ulysses.uneven_heads=true'], hints=('emulator.memory_limit', 'vm.max_map_count'), timeout=60)
expect('16384-rank netbench', ['netbench', 'uniform', '-g', '16384'], hints=('vm.max_map_count',), timeout=60)
# Any --jobs, bounded netbench, a full standard output.
rc, o, e, dt = run(['tune', GOOD, '--nodes', '1', '--jobs', '100000', '--out', os.path.join(WORK, 'tune_jobs')], timeout=120)
results.append(('tune --jobs 100000', rc == 0, 'exit %d' % rc))
for args, hint in ((['-i', '1', '-b', '1', '-e', '1G'], '-i'), (['-w', '100000000'], '--warmup-iters'), (['-e', '-1'], '-e')):
    expect('netbench ' + ' '.join(args), ['netbench', 'uniform'] + args, hints=(hint,), timeout=30)
if os.path.exists('/dev/full'):
    with open('/dev/full', 'w') as full:
        p = subprocess.run([BIN, 'validate', GOOD, '--dump'], stdout=full, stderr=subprocess.PIPE, text=True)
    results.append(('validate --dump to a full disk', p.returncode == 2 and 'standard output' in p.stderr, 'exit %d' % p.returncode))
# calibrate: wild points and #wrong rows refused, no file written.
wild = os.path.join(WORK, 'wild.csv'); cal_out = os.path.join(WORK, 'wild_fit.toml')
w(wild, 'op,ranks,nodes,bytes,time_us\nall_gather,8,2,1024,0.001\nall_gather,8,2,2048,1000000000\nall_gather,8,2,4096,0.001\n')
expect('calibrate on points 1e12 apart', ['calibrate', wild, '--cluster', os.path.join(SRC, 'tests/apps/data/calibrate/two_nodes.toml'),
       '--out', cal_out], hints=('--accept-error',), timeout=300)
results.append(('calibrate wrote no file for a refused fit', not os.path.exists(cal_out), cal_out))
if os.path.exists(mark): results.append(('no planted command ran', False, mark))

bad = [r for r in results if not r[1]]
print('%d cases, %d failed' % (len(results), len(bad)))
for n, ok, detail in bad: print('FAIL', n, '::', detail)
with open(os.path.join(WORK, 'results.txt'), 'w') as f:
    for n, ok, detail in results: f.write('%s\t%s\t%s\n' % ('ok' if ok else 'FAIL', n, detail))
sys.exit(1 if bad else 0)
