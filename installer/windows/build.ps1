# Build the Windows bundle and installer: PyInstaller one-folder bundle, its self-test, then
# Inno Setup's ISCC.exe on installer\windows\longlens.iss. Run from a checkout, in PowerShell:
#   powershell -ExecutionPolicy Bypass -File installer\windows\build.ps1
# Needs Python 3.11 (x64): `py -3.11`, or the python.exe that $env:PYTHON names (as CI passes it),
# and Inno Setup 6.3+ (ISCC.exe). Optional code
# signing: set LONGLENS_SIGN_CERT (a .pfx path) and LONGLENS_SIGN_PASSWORD; signtool.exe from
# the Windows SDK must be on PATH.
# Not run on the Linux build machine: written from the PyInstaller and Inno Setup manuals.
$ErrorActionPreference = "Stop"
$Root = Resolve-Path (Join-Path $PSScriptRoot "..\..")
$Work = Join-Path $Root "build\installer-windows"
$Venv = Join-Path $Work "venv"
$Dist = Join-Path $Root "dist"

if (-not (Test-Path (Join-Path $Venv "Scripts\python.exe"))) {
    if ($env:PYTHON) { & $env:PYTHON -m venv $Venv } else { py -3.11 -m venv $Venv }
    if ($LASTEXITCODE -ne 0) { throw "creating the build venv failed" }
    & "$Venv\Scripts\python.exe" -m pip install --upgrade pip
    # requirements.lock pins torch==2.13.0: on Windows PyPI serves the CPU build of that version.
    & "$Venv\Scripts\pip.exe" install --prefer-binary -r "$Root\requirements.lock" -r "$Root\installer\requirements.txt"
    if ($LASTEXITCODE -ne 0) { throw "pip install failed" }
}
& "$Venv\Scripts\pip.exe" install --no-deps --no-build-isolation --force-reinstall "$Root"
if ($LASTEXITCODE -ne 0) { throw "installing Longlens into the build venv failed" }

$env:PYTHONHASHSEED = "0"
Push-Location $Root
try {
    & "$Venv\Scripts\pyinstaller.exe" --noconfirm --clean --distpath $Dist --workpath (Join-Path $Work "pyi") installer\longlens.spec
    if ($LASTEXITCODE -ne 0) { throw "PyInstaller failed" }
} finally { Pop-Location }

# What switch-to-cuda.ps1 installs into its side environment: this Longlens as a wheel + its pins.
$PyDir = Join-Path $Dist "Longlens\python"
New-Item -ItemType Directory -Force $PyDir | Out-Null
& "$Venv\Scripts\pip.exe" wheel --no-deps --no-build-isolation -w $PyDir "$Root"
Copy-Item "$Root\requirements.lock" $PyDir
Copy-Item "$Root\installer\icons\longlens.png" (Join-Path $Dist "Longlens")

# The self-test opens a real window on temporary data and exits 0 when everything works.
& "$Dist\Longlens\longlens.exe" --self-test
if ($LASTEXITCODE -ne 0) { throw "the bundle's self-test failed" }

$Version = (& "$Venv\Scripts\python.exe" -c "import tomllib;print(tomllib.load(open(r'$Root\pyproject.toml','rb'))['project']['version'])").Trim()
$Iscc = (Get-Command ISCC.exe -ErrorAction SilentlyContinue).Source
if (-not $Iscc) { $Iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
if (-not (Test-Path $Iscc)) { throw "ISCC.exe (Inno Setup 6.3+) not found" }
$IsccArgs = @("/DAppVersion=$Version", "/DBundleDir=$Dist\Longlens", "/DOutputDir=$Dist\installer")
if ($env:LONGLENS_SIGN_CERT) {
    # Inno Setup's /S defines a named sign tool; $f is the file it signs (ISCC documentation).
    $Tsa = if ($env:LONGLENS_TIMESTAMP_URL) { $env:LONGLENS_TIMESTAMP_URL } else { "http://timestamp.digicert.com" }
    $Sign = "signtool sign /fd sha256 /td sha256 /tr $Tsa /f `"$env:LONGLENS_SIGN_CERT`" /p `"$env:LONGLENS_SIGN_PASSWORD`" `$f"
    $IsccArgs += @("/Ssigntool=$Sign", "/DSignTool=signtool")
}
& $Iscc @IsccArgs "$Root\installer\windows\longlens.iss"
if ($LASTEXITCODE -ne 0) { throw "ISCC failed" }
Get-ChildItem "$Dist\installer" | Format-Table Name, Length
