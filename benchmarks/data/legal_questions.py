"""Questions over ``legal_docs/`` (7 documents written for this benchmark: a software licence, the terms of
service of a photo storage service, a fitness app's privacy notice, a residential lease, an employment contract,
a data processing agreement and a power-tool warranty).

Each entry: ``(question, document file, answer)`` where ``answer`` is a short phrase copied from the one
passage that answers the question; a chunk is relevant when it contains that phrase (whitespace folded). The
documents share clause language on purpose (notice periods, liability caps, audits, deletion after closing an
account, breach notification, age limits), so many questions have a near-miss in another document: the 48 hours
of the lease's urgent repairs and of the processor's breach notice, the audit clauses of the licence and of the
processing agreement, the inactive-account rules of the storage service and of the fitness app. The questions
were written with the documents, before any retrieval was run on them, and were not changed afterwards: about
half paraphrase the passage ("can we have a labrador" for a dog under 15 kg), about a third name an exact term
(NOTICES.txt, AES-256, GPX, the Family plan, NOK).
"""

QUESTIONS: list[tuple[str, str, str]] = [
    # software_licence.md
    ("how many of my computers can I put Brightloom Studio on", "software_licence.md",
     "install the Software on up to three Devices"),
    ("can I sell artwork I made with the student version of Brightloom", "software_licence.md",
     "may not be sold or used for paid client projects"),
    ("my laptop died before I could deactivate it, can support free up the licence", "software_licence.md",
     "can reset your activations twice per calendar year"),
    ("where are the open-source components and their licences listed", "software_licence.md",
     "listed in the file NOTICES.txt"),
    ("what is the most Brightloom will pay if the program wrecks my project files", "software_licence.md",
     "limited to the Licence Fee actually paid by you"),
    ("who pays for the licence compliance audit", "software_licence.md",
     "underpaid the licence fees by more than 5%"),
    # terms_of_service.md
    ("how old do you have to be to open a Pollenbox account", "terms_of_service.md",
     "at least 16 years old to create a Pollenbox account"),
    ("will my free photo account be wiped if I stop logging in", "terms_of_service.md",
     "have not been signed in to for 12 months"),
    ("I downgraded and now I'm over my quota, will I lose pictures", "terms_of_service.md",
     "new uploads are paused but nothing is deleted"),
    ("can I get my money back if I cancel the annual plan a week after it renewed", "terms_of_service.md",
     "within 14 days of buying or renewing it"),
    ("is my photo library used to train AI", "terms_of_service.md",
     "train machine learning models that are offered to anyone"),
    ("how much space does the Family plan have", "terms_of_service.md", "2 TB shared by up to six members"),
    # privacy_notice.md
    ("how do I stop strangers seeing where my runs start and finish near my house", "privacy_notice.md",
     "within a radius of 200 m to 1 km"),
    ("what happens to my heart rate history if I withdraw consent", "privacy_notice.md",
     "deletes the stored heart-rate data within 30 days"),
    ("how long does Corvid keep server logs with my IP address", "privacy_notice.md",
     "Server logs containing IP addresses are kept for 30 days"),
    ("when does the running app delete an account nobody uses", "privacy_notice.md",
     "If you do not sign in for 24 months"),
    ("can I download my runs as GPX", "privacy_notice.md", "as GPX and FIT files"),
    ("which regulator can I complain to about Corvid", "privacy_notice.md", "the Saxon Data Protection Commissioner"),
    # residential_lease.md
    ("what is the charge for paying the Harrow Quay rent late", "residential_lease.md", "a flat late fee of $75"),
    ("when will the landlord give the security deposit back after we move out", "residential_lease.md",
     "Within 21 days after the Tenants move out"),
    ("can we have a labrador in apartment 5B", "residential_lease.md",
     "one dog weighing under 15 kg when fully grown"),
    ("the heating stopped working in January, how quickly must the landlord fix it", "residential_lease.md",
     "will begin repairs within 48 hours"),
    ("leaving the lease early because I got a job in another city", "residential_lease.md",
     "relocate more than 80 km for a new job"),
    ("how much can the rent go up when we renew", "residential_lease.md", "no more than 4% over the previous rent"),
    # employment_contract.md
    ("how much notice do I have to give if I quit during probation", "employment_contract.md",
     "by giving one week's written notice"),
    ("do I get paid extra for working late before a release", "employment_contract.md", "Overtime is not paid"),
    ("on-call allowance at Tessellate", "employment_contract.md", "£250 per week"),
    ("how many days of annual leave does the engineer get", "employment_contract.md",
     "27 days of paid holiday per year"),
    ("what does the employer put into the pension", "employment_contract.md",
     "The Company contributes 6% of basic salary"),
    ("can Mira join a rival robotics firm straight after she leaves", "employment_contract.md",
     "must not work on motion-control firmware"),
    # data_processing_agreement.md
    ("how fast must the hosting company tell Corvid about a data breach", "data_processing_agreement.md",
     "within 48 hours of becoming aware of it"),
    ("what can Corvid do if Nimbusfold wants to add a new subcontractor", "data_processing_agreement.md",
     "may object on reasonable data protection grounds"),
    ("in which cities is the app data stored", "data_processing_agreement.md",
     "data centres in Frankfurt and Dublin"),
    ("how much warning does the controller have to give before auditing the processor",
     "data_processing_agreement.md", "on at least 45 days' written notice"),
    ("what happens to the user data when the hosting contract ends", "data_processing_agreement.md",
     "delete existing copies, within 60 days"),
    ("AES-256 encryption at rest", "data_processing_agreement.md", "encryption of data at rest with AES-256"),
    # product_warranty.md
    ("how do I get a longer guarantee on my Halvard drill", "product_warranty.md", "extended to 5 years"),
    ("my battery holds less charge than when new, will they replace it", "product_warranty.md",
     "not less than 70% of its rated capacity"),
    ("are saw blades and drill bits covered", "product_warranty.md", "consumables, including saw blades, drill bits"),
    ("how long does a warranty repair take", "product_warranty.md", "within 10 working days of receiving it"),
    ("I bought the tool second hand, does the guarantee still apply", "product_warranty.md",
     "The warranty stays with the product if it is sold"),
    ("what do I pay if the service centre finds nothing wrong", "product_warranty.md",
     "inspection and return shipping fee of NOK 350"),
]
