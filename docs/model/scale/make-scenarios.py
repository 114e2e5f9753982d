import itertools
for cpus, drives, mode in itertools.product([1, 4, 16, 64, 128, 256], [1, 2, 4, 8], ["strict", "lazy", "passthrough", "off"]):
    cmdq = 'cmdq = "lockfree"\n' if mode in ("strict", "lazy") else ""
    devs = '[[device]]\nkind = "nvme"\n' * drives
    ramp = 5 + cpus // 8
    open(f"s_{cpus:03d}_{drives}_{mode}.toml", "w").write(f'''name = "scale-{cpus}cpu-{drives}nvme-{mode}"
seed = 1
[machine]
platform = "hisilicon-d06"
cpus = {cpus}
memory_gib = 256
[iommu]
model = "smmuv3"
mode = "{mode}"
{cmdq}{devs}[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = 4096
iodepth = 32
numjobs = {cpus}
runtime_ms = 10
ramp_ms = {ramp}
''')
