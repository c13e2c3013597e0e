; Inno Setup script for Longlens (Windows x64). It packages the PyInstaller one-folder bundle that
; installer\windows\build.ps1 builds into dist\Longlens, and is compiled by the same script with
; ISCC.exe (Inno Setup 6.3 or newer: "x64compatible" and {autopf} need it).
;   ISCC.exe /DAppVersion=0.1.0 /DBundleDir=..\..\dist\Longlens installer\windows\longlens.iss
; Directives follow https://jrsoftware.org/ishelp/ ([Setup], [Files], [Icons], [Run], ...).
; It cannot be compiled on the Linux build machine; see docs/installing.md.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#ifndef BundleDir
  #define BundleDir "..\..\dist\Longlens"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist\installer"
#endif
#define AppName "Longlens"
#define AppExeName "longlens.exe"
#define AppPublisher "The Longlens project"

[Setup]
; AppId identifies the installation for upgrades and the uninstaller: never change it.
AppId={{5B0C6E0E-7C1B-4C55-9E57-2F3C1A0D4B19}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher={#AppPublisher}
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
; Per-user install by default (no administrator needed); the dialog offers all users.
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
; torch and Qt in the bundle are 64-bit x64 binaries.
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir={#OutputDir}
OutputBaseFilename=Longlens-{#AppVersion}-windows-x64-setup
SetupIconFile=..\icons\longlens.ico
UninstallDisplayIcon={app}\{#AppExeName}
UninstallDisplayName={#AppName}
Compression=lzma2/max
SolidCompression=yes
; The CPU bundle compresses to well under the 4,200,000,000 bytes a single Setup.exe can hold
; (above that Inno Setup requires DiskSpanning). The CUDA build of torch would add gigabytes of
; cuDNN/cuBLAS to every download, which is why the installer ships the CPU build.
DiskSpanning=no
WizardStyle=modern
ChangesEnvironment=no
CloseApplications=yes
; A signed installer: set the "signtool" command in the IDE or pass /Ssigntool=... to ISCC
; (https://jrsoftware.org/ishelp/topic_setup_signtool.htm); build.ps1 does when
; LONGLENS_SIGN_CERT is set.
#ifdef SignTool
SignTool={#SignTool}
SignedUninstaller=yes
#endif

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
; The whole one-folder bundle. ignoreversion: PyInstaller's DLLs carry no version resources
; that Inno Setup could compare, and a reinstall must replace them all.
Source: "{#BundleDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs
Source: "..\switch-to-cuda.ps1"; DestDir: "{app}"; Flags: ignoreversion
Source: "..\..\docs\installing.md"; DestDir: "{app}"; DestName: "INSTALLING.md"; Flags: ignoreversion

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExeName}"; WorkingDir: "{app}"
Name: "{autoprograms}\{#AppName} self-test"; Filename: "{cmd}"; Parameters: "/k ""{app}\{#AppExeName}"" --self-test"; WorkingDir: "{app}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExeName}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExeName}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; A CUDA switch (switch-to-cuda.ps1) adds a side environment inside the install folder.
Type: filesandordirs; Name: "{app}\cuda-env"
; The catalog, indexes, settings and models live in the user's data folders, not here: they
; are kept on uninstall (`longlens paths` shows where).
