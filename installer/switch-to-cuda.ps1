# Run Longlens on an NVIDIA GPU (Windows): set up a side environment with the CUDA build of torch.
#
#   powershell -ExecutionPolicy Bypass -File switch-to-cuda.ps1 [-Cuda cu128] [-EnvDir DIR]
#   powershell -ExecutionPolicy Bypass -File switch-to-cuda.ps1 -Undo
#
# The installed app is a frozen PyInstaller bundle whose torch was fixed at build time: it cannot
# be swapped in place. This script builds a Python environment beside it (needs Python 3.11 from
# python.org as `py -3.11`, and internet access) with the CUDA build of the same torch version and
# the same Longlens version (the wheel in python\), plus a "Longlens (CUDA)" Start-menu shortcut.
# Both apps share the catalog, settings and models. The bundled app stays the CPU one.
# Written from the pip and PyTorch install documentation; not run on the Linux build machine.
param(
    [string]$Cuda = "cu128",
    [string]$EnvDir = (Join-Path $env:LOCALAPPDATA "Longlens\cuda-env"),
    [switch]$Undo
)
$ErrorActionPreference = "Stop"
$Here = $PSScriptRoot
$Shortcut = Join-Path ([Environment]::GetFolderPath("Programs")) "Longlens (CUDA).lnk"

if ($Undo) {
    if (Test-Path $EnvDir) { Remove-Item -Recurse -Force $EnvDir }
    if (Test-Path $Shortcut) { Remove-Item -Force $Shortcut }
    Write-Host "CUDA environment removed; the bundled (CPU) Longlens is unchanged."
    exit 0
}

$Wheel = Get-ChildItem (Join-Path $Here "python\longlens-*.whl") -ErrorAction SilentlyContinue | Select-Object -First 1
$Lock = Join-Path $Here "python\requirements.lock"
$Resources = Join-Path $Here "_internal\resources"
if (-not $Wheel -or -not (Test-Path $Lock)) { throw "run this script from the installed Longlens folder (python\ is missing)" }
if (-not (Test-Path $Resources)) { throw "$Resources is missing; reinstall Longlens" }
if (-not (Get-Command nvidia-smi -ErrorAction SilentlyContinue)) { Write-Warning "nvidia-smi not found; is the NVIDIA driver installed?" }

$TorchVersion = ((Get-Content $Lock | Where-Object { $_ -like "torch==*" }) -replace "torch==", "").Trim()
$New = "$EnvDir.new"
if (Test-Path $New) { Remove-Item -Recurse -Force $New }
py -3.11 -m venv $New
if ($LASTEXITCODE -ne 0) { throw "Python 3.11 is needed (py -3.11)" }
& "$New\Scripts\python.exe" -m pip install --upgrade pip
& "$New\Scripts\pip.exe" install "torch==$TorchVersion" --index-url "https://download.pytorch.org/whl/$Cuda"
if ($LASTEXITCODE -ne 0) { throw "installing the CUDA build of torch failed" }
& "$New\Scripts\pip.exe" install --constraint $Lock $Wheel.FullName
if ($LASTEXITCODE -ne 0) { throw "installing Longlens into the CUDA environment failed" }
& "$New\Scripts\python.exe" -c "import sys, torch; print(torch.__version__, 'GPU available:', torch.cuda.is_available()); sys.exit(0 if torch.version.cuda else 'the installed torch is a CPU build; pick another -Cuda index')"
if ($LASTEXITCODE -ne 0) { throw "the CUDA build of torch did not install" }
if (Test-Path $EnvDir) { Remove-Item -Recurse -Force $EnvDir }
Move-Item $New $EnvDir

$Launcher = Join-Path $EnvDir "longlens-cuda.cmd"
Set-Content -Encoding ASCII $Launcher "@echo off`r`nset LONGLENS_RESOURCES=$Resources`r`n`"$EnvDir\Scripts\python.exe`" -m desktop_app %*`r`n"
$Shell = New-Object -ComObject WScript.Shell
$Link = $Shell.CreateShortcut($Shortcut)
$Link.TargetPath = $Launcher
$Link.IconLocation = (Join-Path $Here "longlens.exe")
$Link.WindowStyle = 7   # minimised: the console of the .cmd launcher stays out of the way
$Link.Save()
& $Launcher --self-test
if ($LASTEXITCODE -ne 0) { throw "the CUDA environment's self-test failed" }
Write-Host "Done: start 'Longlens (CUDA)' from the Start menu."
